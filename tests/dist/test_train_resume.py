"""Resuming from a checkpoint continues exactly where the uninterrupted run would be."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.dist

COMMON = ("schedule.decay_style=cosine", "schedule.decay_steps=6", "schedule.warmup_steps=2")


@pytest.mark.parametrize("nproc,layout", [(1, ()), (2, ("parallel.expert=2",))], ids=["single", "ep2_dp2"])
def test_resume_equals_uninterrupted(tmp_path, nproc, layout, train, metrics):
    straight = tmp_path / "straight"
    train(straight, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    resumed = tmp_path / "resumed"
    train(resumed, nproc=nproc, steps=3, overrides=(*COMMON, *layout))
    second = train(resumed, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    assert "resumed from" in second.stdout and "at step 3" in second.stdout
    a, b = metrics(straight), metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b):
        for key in ("train/lm_loss", "train/mtp_loss_1", "train/lr", "train/grad_norm"):
            assert abs(x[key] - y[key]) <= 1e-6 * max(1.0, abs(x[key])), (x["step"], key, x[key], y[key])
    # a finished run does nothing more
    again = train(resumed, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    assert "already finished" in again.stdout
    assert len(metrics(resumed)) == 6


def test_optimizer_cannot_move_between_ep1_and_ep2(tmp_path, train):
    run = tmp_path / "run"
    train(run, nproc=2, steps=1, overrides=("parallel.expert=2",))
    proc = train(run, nproc=2, steps=2, overrides=("parallel.expert=1",), check=False)
    assert proc.returncode != 0
    assert "expert parallel size 2 and cannot be resharded to 1" in proc.stderr
    assert "checkpoint.load_optimizer=false" in proc.stderr
    # weights-only start from it at EP1 works
    fresh = tmp_path / "fresh"
    train(fresh, nproc=2, steps=1, overrides=(f"checkpoint.load={run}", "checkpoint.load_optimizer=false"))


@pytest.mark.parametrize("layout", [("parallel.tensor=2",), ("parallel.pipeline=2",)], ids=["tp2", "pp2"])
def test_resume_at_another_layout_reshards_optimizer(tmp_path, train, metrics, layout):
    """1 process for 3 steps, then 2 processes at another layout: optimizer state is resharded and the
    run continues like the uninterrupted one (within the numerics of the layout change)."""
    straight = tmp_path / "straight"
    train(straight, steps=5, overrides=COMMON)
    moved = tmp_path / "moved"
    train(moved, steps=3, overrides=COMMON)
    second = train(moved, nproc=2, steps=5, overrides=(*COMMON, *layout))
    assert "at step 3" in second.stdout
    a, b = metrics(straight), metrics(moved)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a[3:], b[3:]):
        for key in ("train/lm_loss", "train/mtp_loss_1"):
            assert abs(x[key] - y[key]) < 2e-3, (x["step"], key, x[key], y[key])
