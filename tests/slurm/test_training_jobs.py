"""`megatron-mtp submit` of the real trainer (tiny CPU config, gloo) on the local two-node cluster.

One uninterrupted 2-node job is the reference; a second identical job is signalled mid-training
the way Slurm warns before a time limit (USR1 to the batch shell), must save, requeue itself,
resume from the saved step and finish, and its loss curve must match the reference step for step.
"""

from __future__ import annotations

import json
import os
import re
import time

import pytest
from submit_helpers import REPO, read, submit_cli, submitted_job_id

pytestmark = pytest.mark.slurm

MAX_STEPS = 8
CONFIG = os.path.join(REPO, "configs", "tiny_cpu.yaml")
OVERRIDES = [
    f"training.max_steps={MAX_STEPS}", "logging.log_interval=1", "logging.eval_interval=0",
    "logging.tensorboard=false", "checkpoint.save_interval=0", "schedule.warmup_steps=2",
    "schedule.decay_style=constant",
]
STEP_LINE = re.compile(r"step (\d+)/\d+ \| lm_loss ([0-9.]+) \| mtp1_loss ([0-9.]+)")
JOB_TIMEOUT = 240


def _submit(cluster, tmp_path, name: str) -> tuple[str, str]:
    run_dir = str(tmp_path / name)
    proc = submit_cli([CONFIG, *OVERRIDES, "--nodes", "2", "--cpu", "--tasks-per-node", "1", "--time", "15",
                       "--run-dir", run_dir, "--job-name", name], cluster.env(), str(tmp_path))
    return submitted_job_id(proc), run_dir


def _rank0_log(run_dir: str, job: str, restart: int) -> str:
    path = os.path.join(run_dir, "logs", f"slurm-{job}", f"restart-{restart}", "rank-0.log")
    return read(path) if os.path.exists(path) else ""


def _losses(text: str) -> dict[int, tuple[float, float]]:
    return {int(m[1]): (float(m[2]), float(m[3])) for m in STEP_LINE.finditer(text)}


def _diagnose(cluster, run_dir: str, job: str) -> str:
    batch = os.path.join(run_dir, "logs", f"slurm-{job}.out")
    parts = [read(batch) if os.path.exists(batch) else "(no batch log)"]
    for restart in (0, 1):
        parts.append(_rank0_log(run_dir, job, restart)[-3000:])
    return "\n".join(parts) + "\n" + cluster.logs()


@pytest.fixture(scope="module")
def reference_run(slurm_cluster, tmp_path_factory):
    """An uninterrupted 2-node × 1-task job (world size 2): its job id, run directory and final state."""
    tmp_path = tmp_path_factory.mktemp("reference")
    job, run_dir = _submit(slurm_cluster, tmp_path, "reference")
    fields = slurm_cluster.wait_for(job, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"),
                                    JOB_TIMEOUT, "COMPLETED")
    return job, run_dir, fields


def test_two_node_training_job_leaves_a_checkpoint_of_the_right_world_size(slurm_cluster, reference_run):
    job, run_dir, fields = reference_run
    assert fields["JobState"] == "COMPLETED", _diagnose(slurm_cluster, run_dir, job)
    assert fields["NodeList"] == "node[1-2]"
    latest = read(os.path.join(run_dir, "checkpoints", "latest")).strip()
    assert latest == f"step_{MAX_STEPS:07d}"
    state = json.loads(read(os.path.join(run_dir, "checkpoints", latest, "train_state.json")))
    assert state["step"] == MAX_STEPS and state["world_size"] == 2 and state["parallel"]["data"] == 2
    log = _rank0_log(run_dir, job, 0)
    assert "world 2 = TP1 × PP1 × DP2" in log
    assert sorted(_losses(log)) == list(range(1, MAX_STEPS + 1))
    # the other rank ran on the other node and finished too
    assert os.path.exists(os.path.join(run_dir, "logs", f"slurm-{job}", "restart-0", "rank-1.log"))
    snapshot = read(os.path.join(run_dir, "slurm", "config.yaml"))
    assert f"max_steps: {MAX_STEPS}" in snapshot and "device: cpu" in snapshot and "backend: gloo" in snapshot


def test_signalled_job_saves_requeues_resumes_and_continues_the_loss_curve(slurm_cluster, reference_run, tmp_path):
    ref_job, ref_dir, ref_fields = reference_run
    assert ref_fields["JobState"] == "COMPLETED", _diagnose(slurm_cluster, ref_dir, ref_job)
    job, run_dir = _submit(slurm_cluster, tmp_path, "signalled")
    deadline = time.time() + JOB_TIMEOUT
    while time.time() < deadline and not _losses(_rank0_log(run_dir, job, 0)).get(2):
        assert slurm_cluster.job(job).get("JobState") in ("PENDING", "RUNNING"), _diagnose(slurm_cluster, run_dir, job)
        time.sleep(0.5)
    assert _losses(_rank0_log(run_dir, job, 0)).get(2), _diagnose(slurm_cluster, run_dir, job)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)  # what --signal=B:USR1@N delivers

    fields = slurm_cluster.wait_for(job, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")
                                    and f["Restarts"] != "0", JOB_TIMEOUT, "requeued and COMPLETED")
    assert fields["JobState"] == "COMPLETED" and fields["Restarts"] == "1", _diagnose(slurm_cluster, run_dir, job)
    batch = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert "received SIGUSR1" in batch and "checkpoint saved; requeueing" in batch and "SLURM_RESTART_COUNT=1" in batch

    first, second = _rank0_log(run_dir, job, 0), _rank0_log(run_dir, job, 1)
    saved = max(_losses(first))
    assert 2 <= saved < MAX_STEPS, "the signal must stop training before the end"
    assert f"saved at step {saved}" in first
    assert f"at step {saved}" in second and "resumed from" in second and "SLURM_RESTART_COUNT=1" in second
    resumed = _losses(second)
    assert sorted(resumed) == list(range(saved + 1, MAX_STEPS + 1)), "the second run must start after the saved step"
    state = json.loads(read(os.path.join(run_dir, "checkpoints", "step_%07d" % MAX_STEPS, "train_state.json")))
    assert state["step"] == MAX_STEPS and state["world_size"] == 2

    # The interrupted run's loss curve is the uninterrupted one, step for step: the resumed job
    # restores weights, optimizer state (Adam moments and step), scheduler, data position and RNG.
    # (A lost Adam step count once showed up here as a 0.01 drift from the second resumed step on.)
    reference = _losses(_rank0_log(ref_dir, ref_job, 0))
    combined = {**_losses(first), **resumed}
    for step in range(1, MAX_STEPS + 1):
        assert combined[step] == pytest.approx(reference[step], abs=1e-3), f"step {step}"
