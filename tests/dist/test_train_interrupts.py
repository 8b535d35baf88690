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


def test_signal_saves_and_exits_75_then_resumes(tmp_path, train, metrics, small_overrides):
    run = tmp_path / "run"
    proc = _popen(run, 200, small_overrides)
    assert _wait_for(lambda: (run / "logs" / "metrics.jsonl").exists()
                     and len((run / "logs" / "metrics.jsonl").read_text().splitlines()) >= 2, proc)
    proc.send_signal(signal.SIGUSR1)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 75, err[-3000:]
    assert "received SIGUSR1" in out
    latest = (run / "checkpoints" / "latest").read_text().strip()
    saved_step = json.loads((run / "checkpoints" / latest / "train_state.json").read_text())["step"]
    assert 2 <= saved_step < 200
    done = train(run, steps=saved_step + 2)
    assert f"at step {saved_step}" in done.stdout
    assert [r["step"] for r in metrics(run)][-2:] == [saved_step + 1, saved_step + 2]


@pytest.mark.parametrize("async_save", ["true", "false"], ids=["background_write", "synchronous_write"])
def test_crash_during_save_keeps_previous_checkpoint(tmp_path, train, small_overrides, async_save):
    run = tmp_path / "run"
    ckpts = run / "checkpoints"
    proc = _popen(run, 200, small_overrides, ("checkpoint.save_interval=1", "checkpoint.keep_last=2",
                                              f"checkpoint.async_save={async_save}"))
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
    resumed = train(run, steps=step + 1, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=2"))
    assert f"at step {step}" in resumed.stdout
    assert not any(p.suffix == ".tmp" for p in ckpts.glob("step_*"))  # cleaned by the next save
    assert len([p for p in ckpts.glob("step_*") if p.is_dir()]) == 2  # keep_last
