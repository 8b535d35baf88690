"""Start a local multi-process job on this machine: `megatron-mtp train --nproc-per-node N`.

Design note. The launcher starts the N ranks itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as
torchrun sets them) instead of going through torch's elastic agent, so that it owns what a user
expects of one command:
  - TERM and USR1 sent to the launcher reach every rank exactly once (the trainer finishes the step,
    saves and exits 75); INT (Ctrl-C) is sent on as TERM, the trainer's save-and-exit signal. The
    ranks run in a session of their own, so a terminal's Ctrl-C reaches them only through here.
  - The launcher waits for the save and exits with the ranks' code (75: rerun to resume); a rank that
    fails ends the others, and the launcher exits with the failing rank's code.
  - No rank outlives the launcher: each rank asks the kernel for SIGTERM when its parent dies (even
    if the launcher is killed with SIGKILL), which makes it save and exit.
"""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time

from megatron_mtp.errors import EXIT_RESUME

FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1, signal.SIGINT: signal.SIGTERM}
FAILED_RANK_GRACE_S = 10.0
"""How long the other ranks may take to end on their own after one failed, before they are killed
(they may be waiting for the failed rank inside a collective)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _term_when_parent_dies() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def rank_env(rank: int, nproc: int, port: int, base: dict) -> dict:
    """The environment torchrun would give rank `rank` of a one-node job."""
    return dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))


def run_local(nproc: int, argv: list[str]) -> int:
    """Run `megatron-mtp ARGV` in `nproc` processes; returns the job's exit code (see the module note)."""
    base = dict(os.environ)
    # Each process would otherwise claim every core; on CPU, split them.
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    port = free_port()
    procs: list[subprocess.Popen] = []

    def forward(signum, _frame):
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(FORWARDED[signal.Signals(signum)])

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        for rank in range(nproc):
            procs.append(subprocess.Popen([sys.executable, "-m", "megatron_mtp", *argv],
                                          env=rank_env(rank, nproc, port, base), start_new_session=True,
                                          preexec_fn=_term_when_parent_dies))
        return _wait(procs)
    finally:
        for proc in procs:  # an exception here (or in _wait) must not leave ranks behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _wait(procs: list[subprocess.Popen]) -> int:
    """Wait for every rank; once one fails, give the others FAILED_RANK_GRACE_S, then kill them."""
    failed_at = None
    while any(p.poll() is None for p in procs):
        codes = [p.returncode for p in procs if p.returncode is not None]
        if failed_at is None and any(c not in (0, EXIT_RESUME) for c in codes):
            failed_at = time.monotonic()
        if failed_at is not None and time.monotonic() - failed_at > FAILED_RANK_GRACE_S:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    failed = [c for c in codes if c not in (0, EXIT_RESUME)]
    if failed:  # the rank that failed first exited with its own code; the ones killed after it, by signal
        code = max(failed)
        return code if code > 0 else 128 - code
    return EXIT_RESUME if EXIT_RESUME in codes else 0
