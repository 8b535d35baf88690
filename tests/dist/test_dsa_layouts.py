"""DeepSeek Sparse Attention (configs/deepseek_v32_tiny_cpu.yaml: a lightning indexer in every layer and the MTP
layer, 16 of the 64 tokens read per query) trains like one process at step 1 at TP2×EP2 (sequence parallel, the
experts folded over the tensor ranks), PP2 (the MTP layer on the last stage) and CP2 (megatron-core's all-gather
DSA: each rank's chunks of every sequence, the keys gathered in sequence order).

Under TP the indexer runs whole on each tensor rank (its weights replicated, their gradients averaged over TP)
and its KL target sums the heads' attention over TP; under CP each rank's indexer loss is a mean over its own
queries (models/dsa/transformer_config.py). The indexer's gradients are a small part of the gradient norm at
the config's coefficient (0.01: 2e-5 of a norm of 1.1), so the runs weigh its KL by 100: its gradients are then
a quarter of the norm, and a layout that sums them twice where one process takes them once (CP's backward scale
before the fix) moves the norm by 4%. The indexer's gradient, a difference of two near-equal distributions,
carries its target's TP reduction order into the norm (1.4e-5 of it seen; compared to 1e-4); the indexer loss,
a KL of 2.5e-4 made of entropies of order 1, likewise (5e-5 of itself seen; compared to 2e-4). One step, one
micro-batch: step 1 is what every layout must equal (later steps drift apart by reduction order, as
tests/dist/test_gemma4_layouts.py says). The TP2×EP2 run's step-1 checkpoint resumes at CP2×EP2 with its step 2."""

from __future__ import annotations

import pytest
from scalars import values

from megatron_mtp.platform.megatron_core import is_019
from tests.dist.conftest import run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore,
              pytest.mark.skipif(not is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")]

DSA = ("model.indexer_loss_coeff=100", "training.global_batch_size=2")
LAYOUTS = {
    "tp2_ep2": ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"),
    "pp2": ("parallel.pipeline=2",),
    "cp2": ("parallel.context=2",),
}
KEYS = ("train/lm_loss", "train/mtp_loss_1", "moe/balance_loss", "train/indexer_loss",
        "train/indexer_loss/layer_01", "train/indexer_loss/layer_02", "train/indexer_loss/layer_03")
"""Layer 3 is the MTP layer's indexer (logged apart from decoder layer 1's)."""


SAVED = {"tp2_ep2": ("checkpoint.save_interval=1", "checkpoint.optimizer_format=reshardable")}
"""The TP2×EP2 run trains 2 steps and keeps its step 1 (the indexer's replicated weights saved once over TP), which
the resume test loads at CP2×EP2 (reshardable: by parameter name)."""


def _train(train, run, nproc, overrides, steps=1):
    return train(run, nproc=nproc, steps=steps, overrides=(*DSA, *overrides), config="deepseek_v32_tiny_cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train, metrics):
    """name -> the train rows of that layout's run (one process: "single"), each run once when first asked for."""
    root, done = tmp_path_factory.mktemp("dsa_layouts"), {}

    def rows(name: str) -> list[dict]:
        if name not in done:
            overrides = LAYOUTS.get(name, ())
            _train(train, root / name, 2 if overrides else 1, (*overrides, *SAVED.get(name, ())),
                   steps=2 if name in SAVED else 1)
            done[name] = [r for r in metrics(root / name) if "train/lm_loss" in r]
        return done[name]

    rows.root = root
    return rows


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_dsa_layout_matches_single_process_at_step_1(runs, name):
    got, want = runs(name)[0], runs("single")[0]
    assert got["step"] == want["step"] == 1
    for key in KEYS:
        a, b = values([got], key)[0], values([want], key)[0]
        close = abs(a / b - 1) < 2e-4 if key.startswith("train/indexer_loss") else abs(a - b) < 1e-5
        assert close, (name, key, a, b)
    a, b = got["train/grad_norm"], want["train/grad_norm"]
    assert abs(a / b - 1) < 1e-4, (name, a, b)


def test_dsa_resumes_at_another_layout(runs, tmp_path, train, metrics):
    """The TP2×EP2 run's step-1 checkpoint continues at CP2×EP2 (the experts over the context ranks): its step 2
    is the uninterrupted run's (the same weights and optimizer state, another reduction order)."""
    uninterrupted = runs("tp2_ep2")
    run = run_as_of(runs.root / "tp2_ep2", tmp_path / "run", 1)
    second = _train(train, run, 2, ("parallel.context=2", "parallel.expert=2"), steps=2)  # EP stays (optimizer)
    assert "resumed from" in second.stdout
    rows = [r for r in metrics(run) if "train/lm_loss" in r]
    assert [r["step"] for r in rows] == [1, 2]
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        assert abs(values(rows, key)[1] - values(uninterrupted, key)[1]) < 1e-5, key
    a, b = values(rows, "train/indexer_loss")[1], values(uninterrupted, "train/indexer_loss")[1]
    assert abs(a / b - 1) < 2e-4, (a, b)
