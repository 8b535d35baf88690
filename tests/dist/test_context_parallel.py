"""Context parallelism on CPU over real gloo process groups: megatron-core's MTP roll across CP ranks, and
a CP run resumed (its layouts beside one process: tests/dist/test_train_layouts.py)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.mcore]


@pytest.mark.parametrize("cp", [2, 4])
def test_mtp_roll_over_context_parallel_ranks_equals_the_whole_sequence_rolled(cp, script):
    proc = script("cp_roll.py", nproc=cp)
    assert proc.returncode == 0 and "CPROLL OK" in proc.stdout, proc.stderr[-4000:]


def test_a_context_parallel_run_resumes_as_one_process_runs_on(tmp_path, train, metrics):
    """CP2 (the local attention gathering keys and values) trains one step, saves, and resumes: its losses
    and grad norms are the one-process run's at both steps (models/context_parallel.py)."""
    single, cp2 = tmp_path / "single", tmp_path / "cp2"
    train(single, steps=2)
    save = ("checkpoint.save_interval=1", "parallel.context=2")
    train(cp2, nproc=2, steps=1, overrides=save)
    proc = train(cp2, nproc=2, steps=2, overrides=save)
    assert "× CP2 × DP1" in proc.stdout and "resumed from" in proc.stdout
    want, got = metrics(single), metrics(cp2)
    assert [r["step"] for r in got] == [1, 2]
    for key in ("train/lm_loss", "train/mtp_loss_1", "train/grad_norm"):
        assert all(abs(a[key] - b[key]) < 1e-5 for a, b in zip(got, want)), (key, got, want)
