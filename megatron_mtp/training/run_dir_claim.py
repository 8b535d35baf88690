"""A trainer's claim on its run directory, made before anything in it is written.

Rank 0 takes the run lock (checkpoint/run_lock.py) and prepares the directory; every rank learns
the outcome through one all-reduce, so a refusal ends every rank with the same sentence instead of
leaving the other ranks waiting in their first collective.
  - checkpoint.start_fresh with checkpoints present: checkpoints/ is moved aside, never deleted;
  - interrupted saves (*.tmp) of earlier runs are removed (the space they hold may be what the
    next save needs);
  - a checkpoint directory that cannot be written is refused now, not after the first steps ran.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Optional

import torch

from megatron_mtp.checkpoint import run_lock
from megatron_mtp.checkpoint.run_dir import CHECKPOINTS_DIR, complete_steps
from megatron_mtp.errors import RunError, UserError
from megatron_mtp.platform import all_reduce_sum


def _prepare(run_dir: Path, start_fresh: bool) -> list[str]:
    notes = []
    root = run_dir / CHECKPOINTS_DIR
    if start_fresh and complete_steps(root):
        aside = run_dir / f"{CHECKPOINTS_DIR}.old-{time.strftime('%Y%m%d-%H%M%S')}"
        root.rename(aside)
        notes.append(f"checkpoint.start_fresh: moved the existing checkpoints to {aside}")
    try:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        probe = root / ".write-test"
        probe.write_text("ok")
        probe.unlink()
    except OSError as exc:
        raise UserError(f"the checkpoint directory {root} cannot be written ({exc.strerror}); give --run-dir a "
                        "writable directory") from None
    return notes


def claim_run_dir(run_dir: Path, start_fresh: bool, ranks) -> tuple[Optional[run_lock.RunLock], list[str]]:
    """(the held lock on rank 0, notes to print) — raises RunError on every rank if refused."""
    lock, notes, problem = None, [], None
    if ranks.rank == 0:
        try:
            lock = run_lock.acquire(run_dir)
            if lock.took_over:
                notes.append(lock.took_over)
            notes += _prepare(run_dir, start_fresh)
        except UserError as exc:
            problem = str(exc)
            if lock is not None:
                lock.release()
                lock = None
    refused = all_reduce_sum(torch.tensor([1.0 if problem else 0.0]))
    if float(refused[0]) > 0:
        raise RunError(problem or "rank 0 could not claim the run directory")
    return lock, notes


def run_dir_state(run_dir: Path) -> tuple[bool, bool, bool]:
    """(run dir, checkpoints/, lock file) exist: what forget_claim restores after a failed start."""
    return run_dir.exists(), (run_dir / CHECKPOINTS_DIR).exists(), (run_dir / run_lock.LOCK_FILE).exists()


def forget_claim(run_dir: Path, before: tuple[bool, bool, bool]) -> None:
    """Undo what claim_run_dir created when the start failed after it (rank 0, lock released): an empty
    checkpoints/, the lock file, and the run directory if it is empty now and was not there before."""
    had_dir, had_checkpoints, had_lock = before
    try:
        if not had_checkpoints and (run_dir / CHECKPOINTS_DIR).is_dir():
            (run_dir / CHECKPOINTS_DIR).rmdir()  # only if empty: a failed start wrote no checkpoint
        if not had_lock:
            (run_dir / run_lock.LOCK_FILE).unlink(missing_ok=True)
        if not had_dir:
            run_dir.rmdir()
    except OSError:
        pass  # something else is in it now: keep it
