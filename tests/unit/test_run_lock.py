"""One trainer per run directory: the lock refuses a live holder and takes over a dead one."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import textwrap
import time

import pytest

from megatron_mtp.checkpoint import run_lock
from megatron_mtp.errors import UserError


def _record(path, **fields):
    base = {"host": socket.gethostname(), "pid": 1, "started": time.time(), "heartbeat": time.time()}
    path.write_text(json.dumps({**base, **fields}))


def test_a_live_holder_is_named_and_the_lock_is_free_after_release(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from megatron_mtp.checkpoint import run_lock
        lock = run_lock.acquire(Path({str(tmp_path)!r}))
        print("held", flush=True)
        sys.stdin.readline()
        lock.release()
    """)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(UserError, match=f"is in use by another trainer \\(host {socket.gethostname()}, "
                                            f"pid {holder.pid}") as info:
            run_lock.acquire(tmp_path)
        assert "\n" not in str(info.value)
    finally:
        holder.communicate("\n", timeout=60)
    lock = run_lock.acquire(tmp_path)  # released: no holder to report
    assert lock.took_over is None
    lock.release()


def test_stale_holders_are_taken_over(tmp_path, monkeypatch):
    file = tmp_path / run_lock.LOCK_FILE
    _record(file, pid=999999)  # this host, and the OS lock is free: that process has ended
    lock = run_lock.acquire(tmp_path)
    assert "no longer running" in lock.took_over and "on this host no longer holds it" in lock.took_over
    lock.release()
    _record(file, host="node-that-died", heartbeat=time.time() - 2 * run_lock.STALE_AFTER_S)
    lock = run_lock.acquire(tmp_path)
    assert "its last heartbeat was" in lock.took_over
    lock.release()
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    _record(file, host="node7", slurm_job_id="4242", slurm_restart_count="0")  # a requeued job, other node
    lock = run_lock.acquire(tmp_path)
    assert "an earlier run of the same Slurm job 4242" in lock.took_over
    assert json.loads(file.read_text())["slurm_job_id"] == "4242"
    lock.release()


def test_a_fresh_holder_on_another_node_is_refused(tmp_path):
    _record(tmp_path / run_lock.LOCK_FILE, host="node3", pid=77, slurm_job_id="9")
    with pytest.raises(UserError, match="appears to be in use by another trainer \\(host node3, pid 77, Slurm job 9"):
        run_lock.acquire(tmp_path)


def test_heartbeat_refreshes_the_record(tmp_path):
    lock = run_lock.acquire(tmp_path)
    before = json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["heartbeat"]
    time.sleep(0.01)
    lock.heartbeat()
    assert json.loads((tmp_path / run_lock.LOCK_FILE).read_text())["heartbeat"] > before
    lock.release()


def test_a_run_directory_that_cannot_be_created_is_one_sentence(tmp_path):
    parent = tmp_path / "read_only"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        if os.access(parent, os.W_OK):  # root ignores the mode bits: a file in the way fails alike
            parent.chmod(0o755)
            (parent / "blocker").write_text("")
            target = parent / "blocker" / "run"
        else:
            target = parent / "run"
        with pytest.raises(UserError, match=r"cannot create the run directory .* pass a --run-dir on a writable"):
            run_lock.acquire(target)
    finally:
        parent.chmod(0o755)
