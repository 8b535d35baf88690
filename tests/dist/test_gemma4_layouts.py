"""Gemma 4 trains like one process at TP2×EP2 (sequence parallel, experts folded over the tensor ranks), at
PP2×VPP2 (one layer per virtual stage, both layer kinds on each pipeline rank, MTP on the last) and at CP2×EP2
(sliding windows across the context-parallel chunks), and a
run resumes at another layout as if uninterrupted (EP2 over data-parallel ranks -> TP2×EP2).

Its layers are the family's own megatron-core modules (models/gemma4/): per-kind attention projections
split over TP by heads and key/value heads, the dense MLP and the MoE block beside it, the router's
learned scales replicated over TP (their gradients summed under sequence parallelism). Step 1 is compared
with the one-process run to float32 reduction order (losses, the gradient norm, the balance loss). Later
steps are not: Gemma's router logits start near 0.02 (a weight of σ 0.02 over an input normed to
H^-1/2), so the experts are nearly tied and a reduction-order difference flips routing decisions, which
Adam's first steps then amplify (EP2 alone, which changes no reduction, stays within 1e-5 for three steps).
The resume is compared with the uninterrupted run at the layout it left: its step-3 losses come from the
same weights."""

from __future__ import annotations

import pytest
from scalars import values

from tests.dist.conftest import run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

GEMMA = ("model.num_layers=4", "model.sliding_window=16")
"""Four layers with windows of 16 of the 64 tokens."""
SLIDING_FULL = "model.layer_types=[sliding_attention,full_attention,sliding_attention,full_attention]"
LAYOUTS = {
    "ep2": (2, ("parallel.expert=2",)),
    "tp2_ep2": (2, ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1")),
    # both layer kinds on each pipeline rank, one layer per virtual stage
    "pp2_vpp2": (2, ("parallel.pipeline=2", "parallel.virtual_pipeline=2")),
    # each sequence over 2 ranks in chunks of 16 (the windows of 16 reach into the other rank's chunks; RoPE at
    # the chunks' own positions), experts over the same ranks
    "cp2_ep2": (2, ("parallel.context=2", "parallel.expert=2")),
}
STEPS = 3
SAVED = {"ep2": ("checkpoint.save_interval=2", "checkpoint.keep_last=2", "checkpoint.optimizer_format=reshardable")}
"""The EP2 run keeps its step 2, which the resume test takes to TP2×EP2 (reshardable: by parameter name)."""


def _train(train, run, nproc, overrides, steps=STEPS):
    return train(run, nproc=nproc, steps=steps, overrides=(*GEMMA, SLIDING_FULL, *overrides), config="gemma4_tiny_cpu")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train, metrics):
    """name -> the train rows of that layout's run (one process: "single"), each run once when first asked for."""
    root, done = tmp_path_factory.mktemp("gemma4_layouts"), {}

    def rows(name: str) -> list[dict]:
        if name not in done:
            nproc, overrides = LAYOUTS.get(name, (1, ()))
            _train(train, root / name, nproc, (*overrides, *SAVED.get(name, ())))
            done[name] = [r for r in metrics(root / name) if "train/lm_loss" in r]
        return done[name]

    rows.root = root
    return rows


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_gemma4_layout_matches_single_process_at_step_1(runs, name):
    got, want = runs(name), runs("single")
    assert [r["step"] for r in got] == list(range(1, STEPS + 1))
    for key, tol in (("train/lm_loss", 1e-5), ("train/mtp_loss_1", 1e-5), ("moe/balance_loss", 1e-5)):
        assert abs(values(got, key)[0] - values(want, key)[0]) < tol, (name, key)
    a, b = values(got, "train/grad_norm")[0], values(want, "train/grad_norm")[0]
    assert abs(a / b - 1) < 1e-5, (name, a, b)


def test_gemma4_resumes_at_another_layout(runs, tmp_path, train, metrics):
    uninterrupted = runs("ep2")
    run = run_as_of(runs.root / "ep2", tmp_path / "run", 2)
    second = _train(train, run, 2, LAYOUTS["tp2_ep2"][1])  # the optimizer state resharded to TP2 (EP stays)
    assert "resumed from" in second.stdout
    rows = [r for r in metrics(run) if "train/lm_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        assert abs(values(rows, key)[2] - values(uninterrupted, key)[2]) < 1e-5, key
