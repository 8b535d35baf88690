"""A rank that dies (kill -9) or stops (kill -STOP) is named in one sentence, and the local launcher
starts the job again from its latest checkpoint (--max-restarts); real processes, short timeouts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


def _heartbeat(run: Path, rank: int) -> dict | None:
    try:
        return json.loads((run / "logs" / "heartbeat" / f"rank-{rank:05d}.json").read_text())
    except (OSError, ValueError):
        return None


def _wait_for(predicate, proc, said, timeout=240.0):
    deadline = time.time() + timeout
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        assert proc.poll() is None, said.text()[-3000:]
        time.sleep(0.01)
    raise AssertionError("timed out")


class _Lines:
    """A pipe's lines as they come, each with the time it arrived (read by a thread)."""

    def __init__(self, pipe):
        self.lines: list[tuple[float, str]] = []
        self.thread = threading.Thread(target=self._read, args=(pipe,), daemon=True)
        self.thread.start()

    def _read(self, pipe):
        for line in pipe:
            self.lines.append((time.time(), line.rstrip("\n")))

    def text(self) -> str:
        self.thread.join(timeout=30)
        return "\n".join(line for _, line in self.lines)


def test_a_dead_rank_then_a_hung_rank_are_named_and_the_job_restarts_each_time(tmp_path, small_overrides):
    run = tmp_path / "run"
    hang_timeout = 4
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--run-dir",
           str(run), "--max-steps", "12", "--nproc-per-node", "2", "--max-restarts", "2", *small_overrides,
           "parallel.expert=2", "checkpoint.save_interval=2", "checkpoint.keep_last=1",
           f"training.hang_timeout={hang_timeout}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)
    errs, printed = _Lines(proc.stderr), _Lines(proc.stdout)
    try:
        # 1. kill -9 of rank 1 after its third step
        first = _wait_for(lambda: (b := _heartbeat(run, 1)) and b["step"] >= 3 and b, proc, errs)
        os.kill(first["pid"], signal.SIGKILL)
        # 2. in the restarted job, kill -STOP of rank 1 as soon as it reports: before its first step ends (the
        # watchdog watches from the start of training, where hangs after a restart happen)
        second = _wait_for(lambda: (b := _heartbeat(run, 1)) and b["pid"] != first["pid"] and b, proc, errs)
        os.kill(second["pid"], signal.SIGSTOP)
        stopped_at = time.time()
        try:
            proc.wait(timeout=240)
        except subprocess.TimeoutExpired:
            beats = {f.name: f.read_text() for f in (run / "logs" / "heartbeat").glob("*.json")}
            os.killpg(proc.pid, signal.SIGKILL)
            raise AssertionError(f"the job did not end: heartbeats {beats}\n{printed.text()[-3000:]}\n"
                                 f"{errs.text()[-4000:]}") from None
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    out, err = printed.text(), errs.text()
    said = "\n".join(line for line in err.splitlines() if line.startswith("megatron-mtp train:") or "Error" in line)
    assert proc.returncode == 0, said[-6000:]
    assert "Traceback" not in err, err[-4000:]
    lines = [line for line in err.splitlines() if line.startswith("megatron-mtp train:")]
    killed = next((line for line in lines if "was killed by" in line), "\n".join(lines))
    assert f"rank 1 (pid {first['pid']}) was killed by SIGKILL after step" in killed, killed
    hung = next((line for line in lines if "stopped reporting" in line), "\n".join(lines))
    assert len([line for line in lines if "error:" in line]) == 2, "\n".join(lines)  # one sentence each
    assert f"rank 1 (pid {second['pid']} on " in hung and "ending the job (exit 76)" in hung, hung
    assert f"after step {second['step']} during " in hung, hung  # stopped before its first step ended
    # named hang_timeout after the stop, give or take a few beats (the live rank's clock started with the
    # restarted job, just before the stop): not at 10 × hang_timeout
    named_at = next(at for at, line in errs.lines if "stopped reporting" in line)
    assert named_at - stopped_at <= hang_timeout + 3 * max(0.5, hang_timeout / 6) + 4, named_at - stopped_at
    assert "restarting the job from the latest checkpoint (restart 1 of 2)" in err
    assert "restarting the job from the latest checkpoint (restart 2 of 2)" in err
    # each restart resumed from a saved step; the logs hold every step once
    assert out.count("resumed from") == 2, out[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 13))
    # no process of the job outlives the launcher (a killed rank's forked checkpoint writers included)
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).find(str(run)) >= 0]
    assert not left, [_cmdline(pid) for pid in left]


def _cmdline(pid: str) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_a_checkpoint_writer_that_stops_is_named_within_the_hang_timeout(tmp_path, small_overrides):
    """Rank 1's writer stops before its first byte of the save of step 2 (platform/write_progress.py);
    rank 0's writer finishes and waits for it. The watchdog names rank 1's writer, once, about
    hang_timeout after the last byte any writer wrote, and the job ends 76 with no process left."""
    run = tmp_path / "run"
    hang_timeout = 2
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--run-dir",
           str(run), "--max-steps", "2", "--nproc-per-node", "2", *small_overrides, "parallel.expert=2",
           f"training.hang_timeout={hang_timeout}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", MEGATRON_MTP_INJECT_STUCK_WRITE="2:1")
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert proc.returncode == 76, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "rank 1's checkpoint writer made no progress for " in lines[0], lines[0]
    assert f"(training.hang_timeout={hang_timeout}) while saving step 2, with 0.0 MiB of about " in lines[0], lines[0]
    waited = float(lines[0].split("made no progress for ")[1].split(" s")[0])
    assert hang_timeout <= waited <= hang_timeout + 2, lines[0]
    assert not (run / "checkpoints" / "latest").exists()
    left = [pid for pid in os.listdir("/proc") if pid.isdigit() and _cmdline(pid).find(str(run)) >= 0]
    assert not left, [_cmdline(pid) for pid in left]
