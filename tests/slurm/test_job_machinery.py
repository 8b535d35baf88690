"""The job script on a real two-node Slurm cluster, with a torch-free stand-in trainer.

These check what the job script itself does: rendezvous variables from the Slurm environment,
ranks spread over both nodes, per-rank logs, forwarding of the batch shell's USR1 to every rank,
self-requeue on exit 75, resume, and the chain mode. test_training_jobs.py runs the real trainer.
"""

from __future__ import annotations

import glob
import json
import os
import time

import pytest
from submit_helpers import STUB, read, submit_cli, submitted_job_id

pytestmark = pytest.mark.slurm


def _config(tmp_path) -> str:
    path = tmp_path / "stub.yaml"
    path.write_text("name: stub\n")
    return str(path)


def _wait_progress(run_dir: str, ranks: int, at_least: int, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        files = glob.glob(os.path.join(run_dir, "stub", "progress-*"))
        if len(files) == ranks and all(len(read(f).split()) >= at_least for f in files):
            return
        time.sleep(0.3)
    raise AssertionError(f"the ranks did not reach step {at_least} in {timeout} s")


def test_two_node_job_gets_slurm_rendezvous(slurm_cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "2", "--cpu", "--tasks-per-node", "2", "--python", STUB,
                       "--env", "STUB_STEPS=3", "--env", "STUB_FLAVOUR=plain value", "--run-dir", run_dir,
                       "--time", "10"],
                      slurm_cluster.env(), str(tmp_path))
    job = submitted_job_id(proc)
    assert os.path.join(run_dir, "logs", f"slurm-{job}.out") in proc.stdout
    fields = slurm_cluster.wait_for(job, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 60,
                                    "COMPLETED")
    batch_log = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert fields["JobState"] == "COMPLETED", batch_log
    envs = [json.loads(read(p)) for p in sorted(glob.glob(os.path.join(run_dir, "stub", "env-*-0.json")))]
    assert sorted(int(e["RANK"]) for e in envs) == [0, 1, 2, 3]
    assert {e["WORLD_SIZE"] for e in envs} == {"4"}
    assert {e["SLURMD_NODENAME"] for e in envs} == {"node1", "node2"}
    for e in envs:
        assert int(e["LOCAL_RANK"]) == int(e["RANK"]) % 2 and e["LOCAL_WORLD_SIZE"] == "2"
        assert e["SLURMD_NODENAME"] == f"node{int(e['RANK']) // 2 + 1}"
        assert e["MASTER_ADDR"] == "node1" and e["master_resolves"] == "127.0.0.1"
        assert e["OMP_NUM_THREADS"] == "1" and e["STUB_FLAVOUR"] == "plain value"
        assert e["config"] == os.path.join(run_dir, "slurm", "config.yaml")
    assert len({e["MASTER_PORT"] for e in envs}) == 1
    rank_logs = sorted(glob.glob(os.path.join(run_dir, "logs", f"slurm-{job}", "restart-0", "rank-*.log")))
    assert [os.path.basename(p) for p in rank_logs] == [f"rank-{r}.log" for r in range(4)]
    assert all("finished at step 3" in read(p) for p in rank_logs)
    assert "SLURM_RESTART_COUNT=0" in batch_log and "training finished" in batch_log
    assert read(os.path.join(run_dir, "slurm", "jobs.tsv")).startswith(job + "\t")


def test_signal_saves_requeues_and_resumes(slurm_cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "2", "--cpu", "--python", STUB, "--env", "STUB_STEPS=40",
                       "--run-dir", run_dir, "--time", "10"], slurm_cluster.env(), str(tmp_path))
    job = submitted_job_id(proc)
    _wait_progress(run_dir, ranks=2, at_least=5)
    again = submit_cli([_config(tmp_path), "--nodes", "2", "--cpu", "--python", STUB, "--run-dir", run_dir],
                       slurm_cluster.env(), str(tmp_path))
    assert again.returncode == 2 and f"job {job} is still running" in again.stderr, again.stderr
    # To the batch shell only, like the time-limit warning (--signal=B:USR1@N): the script forwards it.
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    fields = slurm_cluster.wait_for(job, lambda f: f["Restarts"] == "1" and f["JobState"] in ("COMPLETED", "FAILED"),
                                    90, "restarted once, then COMPLETED")
    batch_log = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert fields["JobState"] == "COMPLETED", batch_log
    assert "received SIGUSR1" in batch_log and "requeueing job" in batch_log and "SLURM_RESTART_COUNT=1" in batch_log
    for rank in (0, 1):
        first = read(os.path.join(run_dir, "logs", f"slurm-{job}", "restart-0", f"rank-{rank}.log"))
        second = read(os.path.join(run_dir, "logs", f"slurm-{job}", "restart-1", f"rank-{rank}.log"))
        saved = int(first.split("saved at step ")[1].split()[0])
        assert 5 <= saved < 40
        assert f"starts at step {saved} " in second and "finished at step 40" in second
        steps = [int(s) for s in read(os.path.join(run_dir, "stub", f"progress-{rank}")).split()]
        assert steps == list(range(1, 41)), "progress must continue where it stopped, not restart"
        env1 = json.loads(read(os.path.join(run_dir, "stub", f"env-{rank}-1.json")))
        assert env1["SLURM_RESTART_COUNT"] == "1"


def test_chain_mode_next_job_resumes(slurm_cluster, tmp_path):
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "1", "--cpu", "--python", STUB, "--env", "STUB_STEPS=30",
                       "--resume", "chain", "--chain", "3", "--run-dir", run_dir], slurm_cluster.env(), str(tmp_path))
    assert proc.returncode == 0, proc.stderr
    first = submitted_job_id(proc)
    chain = read(os.path.join(run_dir, "slurm", "chain.txt")).split()
    assert len(chain) == 3 and chain[0] == first
    _wait_progress(run_dir, ranks=1, at_least=3)
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", first)
    second = slurm_cluster.wait_for(chain[1], lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 60,
                                    "COMPLETED")
    assert slurm_cluster.job(first)["JobState"] == "COMPLETED"
    assert second["JobState"] == "COMPLETED", read(os.path.join(run_dir, "logs", f"slurm-{chain[1]}.out"))
    third = slurm_cluster.wait_for(chain[2], lambda f: f["JobState"] != "PENDING", 20, "cancelled")
    assert third["JobState"] == "CANCELLED", "a finished chain must cancel its remaining jobs"
    assert [int(s) for s in read(os.path.join(run_dir, "stub", "progress-0")).split()] == list(range(1, 31))


def test_signal_during_startup_still_requeues(slurm_cluster, tmp_path):
    """A signal that kills a rank before its handler exists must not end the run: requeue, resume."""
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "2", "--cpu", "--python", STUB, "--env", "STUB_STEPS=3",
                       "--env", "STUB_SLOW_START=4", "--run-dir", run_dir], slurm_cluster.env(), str(tmp_path))
    job = submitted_job_id(proc)
    batch_log = os.path.join(run_dir, "logs", f"slurm-{job}.out")
    rank_logs = [os.path.join(run_dir, "logs", f"slurm-{job}", "restart-0", f"rank-{r}.log") for r in (0, 1)]
    deadline = time.time() + 30
    while time.time() < deadline and not all(os.path.exists(p) for p in rank_logs):
        time.sleep(0.1)  # slurmstepd opens the rank logs as it launches the tasks
    assert all(os.path.exists(p) for p in rank_logs), "the ranks did not start"
    # the ranks now spend STUB_SLOW_START seconds "starting up" without signal handlers
    slurm_cluster.run("scancel", "--signal=USR1", "--batch", job)
    fields = slurm_cluster.wait_for(job, lambda f: f["Restarts"] == "1" and f["JobState"] in ("COMPLETED", "FAILED"),
                                    90, "restarted once, then COMPLETED")
    log = read(batch_log)
    assert fields["JobState"] == "COMPLETED", log
    assert "after SIGUSR1; requeueing to resume from the latest complete checkpoint" in log
    assert not glob.glob(os.path.join(run_dir, "stub", "env-*-0.json")), "the ranks died before running"
    assert len(glob.glob(os.path.join(run_dir, "stub", "env-*-1.json"))) == 2


@pytest.mark.slow
def test_a_rank_that_dies_requeues_the_job(slurm_cluster, tmp_path):
    """A rank killed without any signal to the job (an OOM kill, an Xid): requeue and resume, bounded."""
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "2", "--cpu", "--python", STUB, "--env", "STUB_STEPS=6",
                       "--env", "STUB_CRASH_AT=3", "--run-dir", run_dir], slurm_cluster.env(), str(tmp_path))
    job = submitted_job_id(proc)
    fields = slurm_cluster.wait_for(job, lambda f: f["Restarts"] == "1" and f["JobState"] in ("COMPLETED", "FAILED"),
                                    120, "restarted once, then COMPLETED")
    log = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert fields["JobState"] == "COMPLETED", log
    assert "(a rank died or hung: see the per-rank logs); requeueing to resume from the latest complete checkpoint " \
           "(restart 1 of 50)" in log, log
    assert len(glob.glob(os.path.join(run_dir, "stub", "env-*-1.json"))) == 2


def test_time_limit_warning_signal_requeues(slurm_cluster, tmp_path):
    """The real thing: Slurm's own --signal=B:USR1@N before a 2-minute limit (slow: Slurm checks
    time limits about once a minute, so the signal comes up to a minute early or late)."""
    run_dir = str(tmp_path / "run")
    proc = submit_cli([_config(tmp_path), "--nodes", "1", "--cpu", "--python", STUB, "--env", "STUB_STEPS=600",
                       "--time", "2", "--signal-before", "100", "--run-dir", run_dir],
                      slurm_cluster.env(), str(tmp_path))
    job = submitted_job_id(proc)
    slurm_cluster.wait_for(job, lambda f: f["Restarts"] == "1", 200, "requeued by the time-limit warning")
    log = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert "received SIGUSR1" in log and "checkpoint saved; requeueing" in log
    first = read(os.path.join(run_dir, "logs", f"slurm-{job}", "restart-0", "rank-0.log"))
    assert "saved at step" in first
    slurm_cluster.run("scancel", job)


def test_job_on_an_untested_environment_fails_before_any_rank_starts(slurm_cluster, tmp_path):
    # the check the job runs inside its image, run here on the node itself (no image): an
    # interpreter without torch stands for an image without the tested packages
    run_dir = str(tmp_path / "run")
    env = dict(slurm_cluster.env(), STUB_CHECK_PYTHON="/usr/bin/python3")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system python3 without torch to stand for a wrong image")
    proc = submit_cli([_config(tmp_path), "--cpu", "--python", STUB, "--env", "STUB_STEPS=3", "--run-dir", run_dir,
                       "--time", "10"], env, str(tmp_path))
    job = submitted_job_id(proc)
    fields = slurm_cluster.wait_for(job, lambda f: f["JobState"] in ("COMPLETED", "FAILED", "CANCELLED"), 60,
                                    "FAILED")
    batch_log = read(os.path.join(run_dir, "logs", f"slurm-{job}.out"))
    assert fields["JobState"] == "FAILED" and fields["ExitCode"].startswith("2:"), (fields, batch_log)
    errors = [line for line in batch_log.splitlines() if "job environment: error:" in line]
    assert len(errors) == 1 and "torch is not installed in the job's Python" in errors[0], batch_log
    assert "not starting training" in batch_log
    assert not glob.glob(os.path.join(run_dir, "stub", "env-*")), "a rank started"
