"""One trainer per run directory: an OS file lock held for the trainer's life.

Design note. Two trainers on one run directory (the same job submitted twice) would overwrite
each other's checkpoints and logs. Rank 0 holds an exclusive POSIX lock (``fcntl.lockf``, which
NFSv4, Lustre and GPFS honour across nodes) on ``RUN_DIR/.trainer.lock`` and writes who holds it:
host, pid, Slurm job id and restart count, start time, and a heartbeat it refreshes at every
logging interval. The kernel (or the file server) drops the lock when its process dies, so:
  - lock not available  -> a live trainer holds it: refuse, naming it;
  - lock available, the file names another holder:
      same Slurm job (a requeued restart), the same host (local locks are reliable), or a heartbeat
      older than STALE_AFTER_S -> the holder is dead: take over, and say so;
      otherwise (another host's job with a fresh heartbeat) the filesystem may not share locks
      between nodes: refuse, saying how to clear it if that trainer is really gone.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from megatron_mtp.errors import UserError

LOCK_FILE = ".trainer.lock"
STALE_AFTER_S = 600.0
"""A heartbeat older than this marks a holder on another host as dead."""


def _identity() -> dict:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "slurm_job_id": os.environ.get("SLURM_JOB_ID"),
        "slurm_restart_count": os.environ.get("SLURM_RESTART_COUNT"),
        "started": time.time(),
    }


def _describe(holder: dict) -> str:
    job = f", Slurm job {holder['slurm_job_id']}" if holder.get("slurm_job_id") else ""
    since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(holder.get("started", 0)))
    return f"host {holder.get('host')}, pid {holder.get('pid')}{job}, since {since}"


def _stale_reason(holder: dict, me: dict, now: float) -> Optional[str]:
    """Why the recorded holder is certainly gone (None if it may still run)."""
    if holder.get("slurm_job_id") and holder.get("slurm_job_id") == me["slurm_job_id"]:
        return f"it was an earlier run of the same Slurm job {me['slurm_job_id']}"
    if holder.get("host") == me["host"]:  # local locks are reliable: a free lock means the holder ended
        return f"process {holder.get('pid')} on this host no longer holds it"
    age = now - float(holder.get("heartbeat", holder.get("started", 0)))
    if age > STALE_AFTER_S:
        return f"its last heartbeat was {age:.0f} s ago"
    return None


@dataclass
class RunLock:
    """The held lock; `heartbeat()` refreshes it, `release()` (or process exit) drops it."""

    path: Path
    fd: int
    record: dict
    took_over: Optional[str] = None
    """A sentence about the stale holder this lock replaced, if any."""

    def _write(self) -> None:
        data = json.dumps(self.record, indent=2).encode() + b"\n"
        os.ftruncate(self.fd, 0)
        os.pwrite(self.fd, data, 0)

    def heartbeat(self) -> None:
        self.record["heartbeat"] = time.time()
        try:
            self._write()
        except OSError:  # a full disk must not stop training here; the save path reports it
            pass

    def release(self) -> None:
        if self.fd < 0:
            return
        try:
            os.ftruncate(self.fd, 0)
        except OSError:
            pass
        os.close(self.fd)
        self.fd = -1


def acquire(run_dir: Path) -> RunLock:
    """Lock ``run_dir`` for this trainer; UserError if another trainer holds it."""
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UserError(f"cannot create the run directory {run_dir} ({exc.strerror}); pass a --run-dir on a "
                        "writable filesystem") from None
    path = run_dir / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise UserError(f"cannot create the run lock {path} ({exc.strerror}); the run directory must be "
                        "writable") from None
    previous = _read(fd)
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        os.close(fd)
        if exc.errno in (errno.EACCES, errno.EAGAIN):
            who = _describe(previous) if previous else "another process"
            raise UserError(f"run directory {run_dir} is in use by another trainer ({who}); stop that job "
                            "first or train in another --run-dir") from None
        raise UserError(f"cannot lock the run directory {run_dir} ({exc.strerror}); use a filesystem that "
                        "supports file locks") from None
    me = _identity()
    took_over = None
    if previous:
        reason = _stale_reason(previous, me, time.time())
        if reason is None:
            os.close(fd)
            raise UserError(
                f"run directory {run_dir} appears to be in use by another trainer ({_describe(previous)}, heartbeat "
                f"under {STALE_AFTER_S:.0f} s old) that this filesystem does not lock across nodes; stop that job, "
                f"or if it is gone delete {path}")
        took_over = f"took over the run lock of a trainer that is no longer running ({_describe(previous)}: {reason})"
    lock = RunLock(path, fd, dict(me, heartbeat=me["started"]), took_over)
    lock._write()
    return lock


def _read(fd: int) -> Optional[dict]:
    try:
        raw = os.pread(fd, 1 << 16, 0)
        record = json.loads(raw) if raw.strip() else None
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None
