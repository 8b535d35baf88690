"""Save-and-exit on a signal, and a crash in the middle of a save, both resume without losing work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def _popen(run_dir: Path, steps: int, small: list, extra: tuple = ()) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"),
           "--run-dir", str(run_dir), "--max-steps", str(steps), *small, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    # own process group: a crash test kills the trainer together with its checkpoint-writer children
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)


def _wait_for(predicate, proc, timeout=300.0, poll=0.01):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if predicate():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(poll)
    return False


def test_ctrl_c_on_one_process_saves_and_exits_75_then_resumes(tmp_path, train, metrics, small_overrides):
    """Ctrl-C (SIGINT) on the one-process main job saves like a save-and-exit signal."""
    run = tmp_path / "run"
    proc = _popen(run, 200, small_overrides)
    assert _wait_for(lambda: (run / "logs" / "metrics.jsonl").exists()
                     and len((run / "logs" / "metrics.jsonl").read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    assert "received SIGINT" in out and "Traceback" not in err, err[-3000:]
    latest = (run / "checkpoints" / "latest").read_text().strip()
    saved_step = json.loads((run / "checkpoints" / latest / "train_state.json").read_text())["step"]
    assert 2 <= saved_step < 200
    done = train(run, steps=saved_step + 2)
    assert f"at step {saved_step}" in done.stdout
    assert [r["step"] for r in metrics(run)][-2:] == [saved_step + 1, saved_step + 2]


@pytest.mark.parametrize("async_save", ["true", "false"], ids=["background_write", "synchronous_write"])
def test_crash_during_save_keeps_previous_checkpoint(tmp_path, train, metrics, small_overrides, async_save):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = _popen(run, 200, small_overrides, ("checkpoint.save_interval=1", "checkpoint.keep_last=2",
                                              f"checkpoint.async_save={async_save}", "logging.tensorboard=true"))
    # kill -9 while a step_N.tmp directory is being written (after at least one complete save)
    def in_save():
        return (ckpts / "latest").exists() and any(p.suffix == ".tmp" and p.is_dir() for p in ckpts.glob("step_*"))

    assert _wait_for(in_save, proc), proc.communicate()[1][-3000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    latest = (ckpts / "latest").read_text().strip()
    assert (ckpts / latest / "train_state.json").exists()  # the pointer names a complete checkpoint
    assert any(p.suffix == ".tmp" for p in ckpts.glob("step_*"))  # the interrupted save is left as .tmp
    step = json.loads((ckpts / latest / "train_state.json").read_text())["step"]
    resumed = train(run, steps=step + 1, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=2",
                                                    "logging.tensorboard=true"))
    assert f"at step {step}" in resumed.stdout
    # the steps trained after `step` and lost are replayed; the logs hold each step once, the replayed values
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, step + 2))
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    logged = events.Scalars("train/lm_loss")
    assert [e.step for e in logged] == list(range(1, step + 2))
    assert abs(logged[-1].value - rows[-1]["train/lm_loss"]) < 1e-5
    assert not any(p.suffix == ".tmp" for p in ckpts.glob("step_*"))  # cleaned by the next save
    assert len([p for p in ckpts.glob("step_*") if p.is_dir()]) == 2  # keep_last


def _processes_naming(text: str) -> list[int]:
    """Pids of the live processes whose command line contains `text` (zombies excluded)."""
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = (Path("/proc") / entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            state = (Path("/proc") / entry / "stat").read_text().split(") ")[-1][:1]
        except OSError:
            continue
        if text in cmdline and state != "Z":
            pids.append(int(entry))
    return pids


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_to_the_local_launcher_reaches_every_rank(tmp_path, train, metrics, small_overrides, sig):
    """`train --nproc-per-node 2`: a signal to the launcher alone (kill PID, or Ctrl-C as SIGINT) makes both
    ranks save, the launcher exit 75 without a traceback, no process of the job outlive it, and the saved
    step resume."""
    run = tmp_path / "run"
    proc = _popen(run, 200, small_overrides, ("--nproc-per-node", "2", "parallel.expert=2"))
    assert _wait_for(lambda: (run / "logs" / "metrics.jsonl").exists()
                     and len((run / "logs" / "metrics.jsonl").read_text().splitlines()) >= 2, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    assert "received SIGTERM" in out and "Traceback" not in err, err[-3000:]
    deadline = time.time() + 20
    while _processes_naming(str(run)) and time.time() < deadline:
        time.sleep(0.1)
    assert not _processes_naming(str(run))
    saved = json.loads((run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
                        / "train_state.json").read_text())["step"]
    assert 2 <= saved < 200
    done = train(run, nproc=2, steps=saved + 1, overrides=("parallel.expert=2",))
    assert f"at step {saved}" in done.stdout
    assert [r["step"] for r in metrics(run)][-1] == saved + 1


def test_nproc_per_node_below_one_is_one_sentence(small_overrides):
    for bad in ("0", "-1"):
        proc = subprocess.run([sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"),
                               "--nproc-per-node", bad, *small_overrides], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2 and proc.stderr.strip() == (
            f"megatron-mtp train: error: --nproc-per-node is {bad}; it must be 1 or more (processes on this machine)")


def test_a_signal_during_a_step_saves_that_step(tmp_path, train):
    """A signal that arrives during step 2's forward/backward is acted on at that step's agreement point:
    the save is step 2 (read before the step, it would be acted on one step late)."""
    run = tmp_path / "run"
    os.environ["MEGATRON_MTP_INJECT_SIGNAL"] = "2"
    try:
        proc = train(run, steps=6, check=False)
    finally:
        del os.environ["MEGATRON_MTP_INJECT_SIGNAL"]
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "received SIGUSR1: saved at step 2" in proc.stdout, proc.stdout[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"


def test_time_based_saves_beside_step_based_ones(tmp_path, train):
    """checkpoint.save_interval_minutes saves whenever that much time passed since the last save (here a
    few milliseconds: every step), agreed by all ranks, with step-based saves off."""
    run = tmp_path / "run"
    train(run, nproc=2, steps=3, overrides=("parallel.expert=2", "checkpoint.save_interval=0",
                                            "checkpoint.save_interval_minutes=0.0001", "checkpoint.keep_last=0"))
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == [
        "step_0000001", "step_0000002", "step_0000003"]


def test_a_signal_during_an_evaluation_ends_it_after_that_batch_and_saves(tmp_path, train):
    """Rank 0 alone receives SIGUSR1 during the first batch of the 40-batch evaluation at step 2: both ranks
    end the evaluation after that batch (agreed, as the evaluation runs collectives), save step 2 and exit 75,
    instead of keeping a short grace period waiting for the whole evaluation."""
    run = tmp_path / "run"
    os.environ["MEGATRON_MTP_INJECT_EVAL_SIGNAL"] = "2"
    try:
        proc = train(run, nproc=2, steps=6, overrides=("parallel.expert=2", "logging.eval_interval=2",
                                                       "logging.eval_steps=40"), check=False)
    finally:
        del os.environ["MEGATRON_MTP_INJECT_EVAL_SIGNAL"]
    assert proc.returncode == 75, proc.stderr[-3000:]
    assert "eval at step 2 stopped after 1 of 40 batches: a save-and-exit signal arrived" in proc.stdout, \
        proc.stdout[-3000:]
    assert "received SIGUSR1: saved at step 2" in proc.stdout, proc.stdout[-3000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"
