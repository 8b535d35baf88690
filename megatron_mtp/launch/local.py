"""Start a local multi-process job on this machine: `megatron-mtp train --nproc-per-node N`.

Design note. The launcher starts the N ranks itself (RANK, WORLD_SIZE, MASTER_ADDR/PORT set as
torchrun sets them) instead of going through torch's elastic agent, so that it owns what a user
expects of one command:
  - TERM and USR1 sent to the launcher reach every rank exactly once (the trainer finishes the step,
    saves and exits 75); INT (Ctrl-C) is sent on as TERM, the trainer's save-and-exit signal. A save
    that takes over SAVE_NOTE_S is explained (a rank that stopped reporting is named); a second signal
    stops every rank at once, without saving. The
    ranks run in a session of their own, so a terminal's Ctrl-C reaches them only through here.
  - The launcher waits for the save and exits with the ranks' code (75: rerun to resume); a rank that
    fails ends the others, and the launcher exits with the failing rank's code.
  - No rank outlives the launcher: each rank asks the kernel for SIGTERM when its parent dies (even
    if the launcher is killed with SIGKILL), which makes it save and exit.
  - A rank killed by a signal (an OOM kill, kill -9, a crash) is named in one sentence with its signal,
    what usually sends it, and the step of its last heartbeat (a signal this launcher passed on before
    the rank's save-and-exit handler was in place is said to be that); a job that ended that way, or
    because a rank was lost or hung (training/watchdog.py, exit 76), is started again from the latest
    checkpoint, up to `--max-restarts` times (default 0: a user at a terminal decides), like the Slurm
    job does.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from megatron_mtp.errors import EXIT_RANK_LOST, EXIT_RESUME, EXIT_USAGE

FORWARDED = {signal.SIGTERM: signal.SIGTERM, signal.SIGUSR1: signal.SIGUSR1, signal.SIGINT: signal.SIGTERM}
FAILED_RANK_GRACE_S = 10.0
"""How long the other ranks may take to end on their own after one failed, before they are killed
(they may be waiting for the failed rank inside a collective)."""
SAVE_NOTE_S = 10.0
"""After a forwarded signal, how long the ranks may take to save before the launcher says what it waits for."""
LOST_RANK_GRACE_S = 3.0
"""The same, after a rank was killed by a signal or lost: the others are ending themselves, or stopped."""


def _term_when_parent_dies() -> None:
    """In the child before exec: SIGTERM when the launcher dies (Linux prctl PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


def rank_env(rank: int, nproc: int, port: int, base: dict) -> dict:
    """The environment torchrun would give rank `rank` of a one-node job."""
    from megatron_mtp.runtime.heartbeats import LAUNCHER_NAMES_DEAD_RANKS

    return dict(base, RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), **{LAUNCHER_NAMES_DEAD_RANKS: "1"})


def run_local(nproc: int, argv: list[str], max_restarts: int = 0, run_dir: Path | None = None) -> int:
    """Run `megatron-mtp ARGV` in `nproc` processes, again after a crash up to `max_restarts` times;
    returns the job's exit code (see the module note)."""
    restarts = 0
    while True:
        signalled: list[int] = []
        code = _run_once(nproc, argv, run_dir, signalled)
        if code in (0, EXIT_RESUME, EXIT_USAGE) or signalled:
            return code
        if restarts >= max_restarts:
            if max_restarts:
                _say(f"the job failed again (exit {code}) after {restarts} restart(s) (--max-restarts "
                     f"{max_restarts}); rerun the same command to resume from the latest checkpoint")
            return code
        restarts += 1
        _say(f"restarting the job from the latest checkpoint (restart {restarts} of {max_restarts})")


def _say(line: str) -> None:
    print(f"megatron-mtp train: {line}", file=sys.stderr, flush=True)


def _run_once(nproc: int, argv: list[str], run_dir: Path | None, signalled: list[int]) -> int:
    base = dict(os.environ)
    # Each process would otherwise claim every core; on CPU, split them.
    base.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # The launcher hosts the job's rendezvous store, as torchrun's agent does: it binds a free port
    # itself (port 0), so no other process can take the port between a look-up and the bind, and each
    # start of the job gets a fresh store. The ranks connect to it as clients (TORCHELASTIC_USE_AGENT_STORE).
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    port = store.port
    base["TORCHELASTIC_USE_AGENT_STORE"] = str(True)
    procs: list[subprocess.Popen] = []

    def forward(signum, _frame):
        signalled.append(signum)
        if len(signalled) > 1:  # asked again while the ranks save: stop them without saving
            _say("stopping every rank without saving (asked twice)")
            for proc in procs:
                if proc.poll() is None:
                    _kill_group(proc)
            return
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(FORWARDED[signal.Signals(signum)])

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        for rank in range(nproc):
            procs.append(subprocess.Popen([sys.executable, "-m", "megatron_mtp", *argv],
                                          env=rank_env(rank, nproc, port, base), start_new_session=True,
                                          preexec_fn=_term_when_parent_dies))
        return _wait(procs, run_dir, signalled)
    finally:
        for proc in procs:  # an exception here (or in _wait) must not leave ranks behind
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            _kill_group(proc)  # nor what a rank forked (checkpoint writers) and left when it was killed
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        del store


def _wait(procs: list[subprocess.Popen], run_dir: Path | None, signalled: list[int] | None = None) -> int:
    """Wait for every rank; once one fails, give the others FAILED_RANK_GRACE_S (LOST_RANK_GRACE_S when
    a rank was lost: the others are ending or waiting for it), then kill them. A rank that a signal
    killed first is named in one sentence. When the ranks take more than SAVE_NOTE_S to save after a
    forwarded signal, say which have stopped reporting and how to stop without saving."""
    failed_at, grace, named = None, FAILED_RANK_GRACE_S, False
    ours: set[int] = set()  # the ranks killed here after the grace
    signalled_at, noted = None, False
    while [p.poll() for p in procs].count(None):  # poll every rank (any() would stop at the first live one)
        if signalled and signalled_at is None:
            signalled_at = time.monotonic()
        if signalled_at is not None and not noted and time.monotonic() - signalled_at > SAVE_NOTE_S:
            noted = True
            _note_slow_save(procs, run_dir)
        if failed_at is None:
            ended = [(rank, p.returncode) for rank, p in enumerate(procs)
                     if p.returncode is not None and p.returncode not in (0, EXIT_RESUME)]
            if ended:
                failed_at = time.monotonic()
                # a rank a signal killed first; the others that saw it gone exited 76 quietly, leaving it to us
                rank, code = min(ended, key=lambda rc: (rc[1] >= 0, rc[0]))
                if code < 0 or code == EXIT_RANK_LOST:
                    grace = LOST_RANK_GRACE_S
                if code < 0 and not (signalled and len(signalled) > 1):  # not the launcher's own kill
                    _name_killed(rank, procs[rank].pid, -code, run_dir, len(procs), signalled)
                    named = True
        if failed_at is not None and time.monotonic() - failed_at > grace:
            for rank, p in enumerate(procs):
                if p.poll() is None:
                    ours.add(rank)
                    _kill_group(p)
        time.sleep(0.05)
    codes = [p.wait() for p in procs]
    if signalled and len(signalled) > 1:
        return 130  # stopped at the user's second request, without saving
    killed_first = [(rank, c) for rank, c in enumerate(codes) if c < 0 and rank not in ours]
    # 76: a rank whose watchdog found a killed peer gone and left its naming here
    if not named and killed_first and not any(c > 0 and c not in (EXIT_RESUME, EXIT_RANK_LOST) for c in codes):
        rank, c = killed_first[0]
        _name_killed(rank, procs[rank].pid, -c, run_dir, len(procs), signalled)
    failed = [c for c in codes if c not in (0, EXIT_RESUME)]
    if failed:  # the rank that failed first exited with its own code; the ones killed after it, by signal
        if named or EXIT_RANK_LOST in failed:
            return EXIT_RANK_LOST
        code = max(failed)
        return code if code > 0 else 128 - code
    return EXIT_RESUME if EXIT_RESUME in codes else 0


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL a rank and every process it forked: each rank leads a process group of its own
    (start_new_session), which megatron-core's forked checkpoint writers share; one whose rank was
    killed mid-save would otherwise wait forever on a lock its rank held."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _note_slow_save(procs: list[subprocess.Popen], run_dir: Path | None) -> None:
    from megatron_mtp.runtime.heartbeats import read_heartbeats

    beats = read_heartbeats(run_dir, len(procs)) if run_dir is not None else {}
    now = time.time()
    silent = [f"rank {rank} (pid {p.pid}, no heartbeat for {now - float(beats[rank]['beat_at']):.0f} s)"
              for rank, p in enumerate(procs) if p.poll() is None and rank in beats
              and now - float(beats[rank].get("beat_at", now)) > SAVE_NOTE_S]
    why = (f"{', '.join(silent)} stopped reporting, and the others wait for it in a collective until "
           "training.hang_timeout (or, with it off, training.collective_timeout) ends them" if silent
           else "they are finishing the step and saving")
    _say(f"still waiting for the ranks to save: {why}; send the signal again (Ctrl-C) to stop every rank "
         "without saving")


CRASH_SIGNALS = {"SIGSEGV", "SIGBUS", "SIGILL", "SIGFPE", "SIGABRT"}


def killed_why(name: str, passed_on: bool) -> str:
    """Why a rank died of signal `name` (`passed_on`: this launcher forwarded that signal to the ranks)."""
    if passed_on:
        return (", which this launcher passed on before the rank could save (it was still starting, or already "
                "ending, outside the training loop); rerun the same command to resume from the latest checkpoint")
    if name == "SIGKILL":
        return " (the kernel's out-of-memory killer, or someone's kill -9)"
    if name in CRASH_SIGNALS:
        return " (a crash in native code: a library, a driver, or corrupted memory)"
    return " (sent by someone or by the system, not through this launcher)"


def _name_killed(rank: int, pid: int, signum: int, run_dir: Path | None, world: int,
                 signalled: list[int] | None = None) -> None:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = f"signal {signum}"
    passed_on = bool(signalled) and any(FORWARDED.get(signal.Signals(s)) == signum for s in signalled)
    when = None
    if run_dir is not None:
        from megatron_mtp.runtime.heartbeats import exit_note

        when = exit_note(run_dir, world, rank)
    _say(f"error: rank {rank} (pid {pid}) was killed by {name}" + (f" {when}" if when else "")
         + f"{killed_why(name, passed_on)}; the other ranks are stopped")
