"""A Gemma 4 assistant (mtp.style assistant) trains on a frozen target like one process at TP2×EP2 (sequence
parallel: its queries split over TP as the target's stored keys are, its projections gathered and split
again), and with the target over two pipeline ranks in four virtual stages (the assistant and the target's two
stored layers on the last one); a run resumes at another layout (one process -> TP2) from the same weights; and
the target is saved exactly as loaded.

Step 1 is compared with the one-process run: the losses of every draft step, and the gradient of every
assistant tensor. The runs take a plain gradient step (Adam with an epsilon far above any gradient and the
learning rate equal to it: w1 = w0 - g), so a checkpoint after step 1 holds each tensor's gradient against
the initial weights w0, which every layout draws from the tensor's global identity (models/initialization.py:
norms 1, the rest its own generator's draw; the test draws them again). A gradient summed on the wrong ranks,
or not at all, is off by a factor; reduction order moves it by 3e-4 at most (measured at TP2×EP2, where the
measure itself is coarsest: norm weights of 1.0 moved by 1e-4). Later steps are not compared, for the reason
test_gemma4_layouts.py gives. The resumed run's step 3 is compared with the uninterrupted run's: it comes from
the same saved weights."""

from __future__ import annotations

import pytest
import torch
from scalars import values

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from tests.dist.conftest import ROOT, run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

GEMMA = ("model.num_layers=4", "model.sliding_window=16",
         "model.layer_types=[sliding_attention,full_attention,sliding_attention,full_attention]")
K = 2
ASSISTANT = ("mtp.style=assistant", f"mtp.num_layers={K}", "mtp.freeze_base=true", "mtp.assistant.hidden_size=64",
             "mtp.assistant.num_layers=2", "mtp.assistant.num_attention_heads=4", "mtp.assistant.ffn_hidden_size=128",
             "mtp.targets=mix")
PLAIN_STEP = ("optimizer.adam_eps=1000", "optimizer.lr=1000", "optimizer.min_lr=1000", "optimizer.weight_decay=0",
              "optimizer.clip_grad=0", "schedule.warmup_steps=0")
"""Adam with ε ≫ |g| and lr = ε: each update is the gradient itself."""
LAYOUTS = {
    "tp2_ep2": (2, ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1")),
    # pipeline rank 1 holds layer 0 and, as its second virtual stage, layers 2 and 3 (the target's last sliding
    # and full layers, whose keys and values the assistant reads) with the assistant
    "pp2_vpp2": (2, ("parallel.pipeline=2", f"parallel.pipeline_layout=E|t|t|tt{'m' * K}L")),
}
STEPS = 3
LOSSES = ("train/lm_loss", *(f"train/mtp_loss_{k}" for k in range(1, K + 1)))


@pytest.fixture(scope="module")
def target(tmp_path_factory, train):
    """A Gemma 4 model without MTP layers (a new run's weights, lr 0), the target the assistant drafts for."""
    run = tmp_path_factory.mktemp("assistant") / "target"
    train(run, steps=1, overrides=(*GEMMA, "mtp.num_layers=0", "optimizer.lr=0", "optimizer.min_lr=0",
                                   "checkpoint.save_interval=1"), config="gemma4_tiny_cpu")
    return run


def _train(train, run, nproc, overrides, target, steps=STEPS):
    return train(run, nproc=nproc, steps=steps, config="gemma4_tiny_cpu",
                 overrides=(*GEMMA, *ASSISTANT, *PLAIN_STEP, f"checkpoint.load={target}", *overrides))


def _step(run, step: int) -> TorchDistReader:
    return TorchDistReader(run / "checkpoints" / f"step_{step:07d}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory, train, metrics, target):
    """name -> the train rows of that layout's one step, saved ("single": one process, 3 steps saved at each)."""
    root, done = tmp_path_factory.mktemp("assistant_layouts"), {}

    def rows(name: str) -> list[dict]:
        if name not in done:
            nproc, overrides = LAYOUTS.get(name, (1, ()))
            # reshardable: the resume test takes the one-process run's step 2 to TP2
            _train(train, root / name, nproc, (*overrides, "checkpoint.save_interval=1", "checkpoint.keep_last=3",
                                               "checkpoint.optimizer_format=reshardable"),
                   target, steps=STEPS if name == "single" else 1)
            done[name] = [r for r in metrics(root / name) if "train/lm_loss" in r]
        return done[name]

    rows.root = root
    return rows


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_assistant_layout_matches_single_process_at_step_1(runs, name):
    got, want = runs(name), runs("single")
    for key in LOSSES:
        assert abs(values(got, key)[0] - values(want, key)[0]) < 1e-5, (name, key)
    assert values(want, f"train/mtp_acceptance_{K}")  # every draft step's acceptance is logged
    root = runs.root
    with _step(root / "single", 1) as one, _step(root / name, 1) as mine:
        keys = [k for k in one.keys() if k.startswith("mtp_assistant.") and not k.endswith("layer_scalar")]
        assert len(keys) == 22
        for key in keys:
            w0 = _initial(key, tuple(one.entry(key).shape))
            want_grad, got_grad = w0 - one.read(key), w0 - mine.read(key)
            assert want_grad.norm() > 0, key
            assert (got_grad - want_grad).norm() / want_grad.norm() < 1e-2, (name, key)


def _initial(key: str, shape: tuple) -> torch.Tensor:
    """An assistant tensor's initial weights at every layout: a norm's ones, or its own generator's draw."""
    from megatron_mtp.config import load_config
    from megatron_mtp.models.initialization import draw_full, parameter_std

    if key.endswith("layernorm.weight"):
        return torch.ones(shape)
    cfg = load_config(str(ROOT / "configs" / "gemma4_tiny_cpu.yaml"))
    return draw_full(cfg.training.seed, key, (), shape, parameter_std(key, cfg.model.init_method_std, 4))


def test_assistant_resumes_at_another_layout_and_leaves_the_target_as_loaded(runs, tmp_path, train, metrics, target):
    uninterrupted = runs("single")
    run = run_as_of(runs.root / "single", tmp_path / "run", 2)  # the one-process run after step 2, resumed at TP2
    second = _train(train, run, 2, ("parallel.tensor=2",), target)  # the optimizer state resharded to TP2
    assert "resumed from" in second.stdout
    rows = [r for r in metrics(run) if "train/lm_loss" in r]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for key in LOSSES:
        assert abs(values(rows, key)[2] - values(uninterrupted, key)[2]) < 1e-5, key
    with _step(target, 1) as src, _step(runs.root / "single", 3) as out:
        weights = [k for k in src.keys() if k.startswith(("embedding.", "decoder.")) and not k.endswith("expert_bias")]
        assert weights and all(torch.equal(src.read(k), out.read(k)) for k in weights)
        assert any(k.startswith("mtp_assistant.layers.1.") for k in out.keys())
