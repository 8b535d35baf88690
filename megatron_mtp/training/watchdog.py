"""Hung and lost ranks: heartbeats, and the one sentence that ends the job so it can be restarted.

Design note. A rank that is stopped (kill -STOP, a frozen node, a hang outside Python) leaves every
other rank waiting inside a collective, which torch.distributed gives up only after
training.collective_timeout; a rank that dies (an Xid, an OOM kill, a lost node) makes the others
fail inside one with a wall of tracebacks that never names it. Both need to name the rank, end the
job quickly and let the launcher or the Slurm job restart it from the latest checkpoint.

Every rank runs a daemon thread that writes RUN_DIR/logs/heartbeat/rank-NNNNN.json every `beat_s`
seconds: host, pid, the last step it finished, what it is doing now ("step 8", "saving step 7",
"evaluating at step 5") and when it last made progress. The thread runs whatever the main thread
does, so a fresh heartbeat means a live process, and a stale one (no write for STALE_BEATS beats, or
on this host a pid that is gone) a stopped or dead one. The files sit on the run directory's shared
filesystem, so this works across nodes without a rendezvous server (the TCP store lives in rank 0's
process, which may be the one that is stopped).
  - hung: a rank whose own progress is older than training.hang_timeout reads every rank's file. A
    stale rank is named ("rank 1 (pid 4242 on node7) stopped reporting 31 s ago, after step 7"); if
    none is stale, every rank is alive and waiting, and the sentence names the step and what each
    rank was doing. The lowest rank that is still alive prints it; every live rank then exits with
    EXIT_RANK_LOST (its own process, at once: the main thread is blocked in the collective).
  - lost: a collective that fails on a live rank (the peer's sockets closed) is caught by the
    trainer, which asks `peer_lost`: it waits up to a few beats for the dead rank's heartbeat to go
    stale and names it, then exits the same way.
The launcher (launch/local.py) and the sbatch script (launch/sbatch_script.py) restart a job that
ended this way, or with a rank killed by a signal, from its latest checkpoint, up to --max-restarts.
NVIDIA's nvidia-resiliency-ext (0.4.1) does the same with rank-monitor servers that its own launcher
(ft_launcher, a torchrun fork) starts beside each rank (RankMonitorClient refuses to start without the
launcher's IPC socket), and its in-process restart aborts NCCL communicators; this project starts its
ranks itself (one Slurm task per GPU, or the local launcher) and trains on gloo on CPU, so it keeps
this small mechanism instead.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from megatron_mtp.errors import EXIT_RANK_LOST, sentence
from megatron_mtp.launch.heartbeats import (
    LAUNCHER_NAMES_DEAD_RANKS,
    STALE_BEATS,
    heartbeat_file,
    pid_gone,
    read_heartbeats,
)


def is_collective_failure(exc: BaseException) -> bool:
    """Whether `exc` is a collective that failed because a peer went away (not a bug of this rank)."""
    import torch

    kinds = tuple(k for k in (getattr(torch.distributed, "DistBackendError", None),
                              getattr(torch.distributed, "DistNetworkError", None)) if k is not None)
    if kinds and isinstance(exc, kinds):
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and any(words in text for words in (
        "Connection closed by peer", "Connection reset by peer", "Broken pipe", "NCCL communicator was aborted",
        "Socket Timeout"))


class Watchdog:
    """This rank's heartbeat thread, and the hang rule (module note)."""

    def __init__(self, run_dir: Path, rank: int, world: int, hang_timeout: float):
        self.run_dir, self.rank, self.world, self.hang_timeout = run_dir, rank, world, hang_timeout
        self.beat_s = min(10.0, max(0.5, hang_timeout / 6)) if hang_timeout else 10.0
        self.file = heartbeat_file(run_dir, rank)
        self.file.parent.mkdir(parents=True, exist_ok=True)
        self.step, self.doing = 0, "starting"
        self.progress_at = time.time()
        self.armed = False  # the hang rule starts with the first step
        self._stop = threading.Event()
        self._write()
        self._thread = threading.Thread(target=self._run, name="megatron-mtp-heartbeat", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ main thread
    def progress(self, step: int, doing: str) -> None:
        """A step, save or evaluation ended; `doing`: what comes next."""
        self.step, self.doing, self.progress_at, self.armed = step, doing, time.time(), True

    def now_doing(self, doing: str) -> None:
        self.doing = doing

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            self.file.unlink()
        except OSError:
            pass

    def peer_lost(self, exc: BaseException) -> None:
        """A collective failed under this rank: name the rank that is gone (waiting a few beats for its
        heartbeat to go stale) and end this rank's process."""
        deadline = time.time() + (STALE_BEATS + 1) * self.beat_s + 2
        lost: list = []
        while time.time() < deadline:
            lost = self._stale(read_heartbeats(self.run_dir, self.world), time.time())
            if lost:
                break
            time.sleep(min(0.5, self.beat_s))
        if lost and os.environ.get(LAUNCHER_NAMES_DEAD_RANKS) == "1":
            self._end(None, lost)  # the local launcher names the rank with its signal (launch/local.py)
        if lost:
            what = self._describe_lost(lost, time.time(), "died or stopped")
        else:
            cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            what = f"a collective failed on rank {self.rank} during {self.doing} ({cause})"
        self._end(what, lost)

    # ---------------------------------------------------------------- thread
    def _write(self) -> None:
        record = {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "step": self.step,
                  "doing": self.doing, "progress_at": self.progress_at, "beat_at": time.time()}
        tmp = self.file.with_name(self.file.name + ".tmp")
        try:
            tmp.write_text(json.dumps(record))
            os.replace(tmp, self.file)
        except OSError:
            pass  # a full or failing disk is the checkpoint path's to report

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            self._write()
            if self.armed and self.hang_timeout and time.time() - self.progress_at > self.hang_timeout:
                self._hung()

    def _stale(self, records: dict[int, dict], now: float) -> list[int]:
        limit = STALE_BEATS * self.beat_s + 1
        return [rank for rank in range(self.world) if rank != self.rank and (
            rank not in records or now - float(records[rank].get("beat_at", 0)) > limit or pid_gone(records[rank]))]

    def _describe_lost(self, lost: list[int], now: float, verb: str) -> str:
        records = read_heartbeats(self.run_dir, self.world)
        parts = []
        for rank in lost[:4]:
            r = records.get(rank)
            if r is None:
                parts.append(f"rank {rank} never reported")
                continue
            age = now - float(r.get("beat_at", now))
            state = "has exited" if pid_gone(r) else f"stopped reporting {age:.0f} s ago"
            parts.append(f"rank {rank} (pid {r.get('pid')} on {r.get('host')}) {state}, "
                         f"after step {r.get('step')} during {r.get('doing')}")
        more = f" and {len(lost) - 4} more ranks" if len(lost) > 4 else ""
        return f"{', '.join(parts)}{more}: its process {verb}, is hung outside Python, or its node is lost"

    def _hung(self) -> None:
        now = time.time()
        records = read_heartbeats(self.run_dir, self.world)
        lost = self._stale(records, now)
        waited = now - self.progress_at
        gone = [rank for rank in lost if rank in records and pid_gone(records[rank])]
        if lost and gone == lost and os.environ.get(LAUNCHER_NAMES_DEAD_RANKS) == "1":
            self._end(None, lost)  # ranks that exited: the local launcher names each with its signal
        if lost:
            what = self._describe_lost(lost, now, "is stopped")
        else:
            doing = sorted({str(r.get("doing")) for r in records.values()})
            what = (f"no rank has made progress for {waited:.0f} s (training.hang_timeout={self.hang_timeout:g}), "
                    f"after step {min(int(r.get('step', 0)) for r in records.values()) if records else self.step}; "
                    f"every rank is alive and waiting ({'; '.join(doing)})")
        self._end(what, lost)

    def _end(self, what: Optional[str], lost: list[int]) -> None:
        alive = [rank for rank in range(self.world) if rank not in lost]
        if what is not None and alive and self.rank == min(alive):
            from megatron_mtp.checkpoint.run_dir import find_checkpoint

            try:
                found = find_checkpoint(self.run_dir)
                where = f"its latest checkpoint {found.path.name}" if found else "the start (no checkpoint yet)"
            except Exception:  # a damaged run directory must not hide the sentence
                where = "its latest checkpoint"
            print(f"megatron-mtp train: error: {sentence(what)}; ending the job (exit {EXIT_RANK_LOST}) so that it "
                  f"restarts from {where}", file=sys.stderr, flush=True)
        sys.stdout.flush()
        self._stop.set()
        os._exit(EXIT_RANK_LOST)
