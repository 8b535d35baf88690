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
  - progress: a step, an evaluation or a save ending, from the start of the training loop (a hang in
    the first step, where restarts hang, is watched too); and, while a save is being written, the
    bytes of the files this rank's checkpoint writer planned growing on disk (platform/
    write_progress.py): a save of any length that keeps writing is alive.
  - hung: a rank whose own progress is older than training.hang_timeout reads every rank's file. A
    stale rank is named ("rank 1 (pid 4242 on node7) stopped reporting 31 s ago, after step 7"). If
    none is stale and another rank made progress within hang_timeout (its writer still writes while
    this one waits for it), it waits on. Otherwise a rank whose writer has not finished is named
    ("rank 1's checkpoint writer made no progress for 601 s ... while saving step 8, with 1.2 GiB of
    about 3.4 GiB written"), or, failing that, the step every rank waits in and what each was doing.
  - one sentence: the first rank to decide creates logs/heartbeat/ended-<launch id> (O_EXCL) and
    prints it; every live rank then exits with EXIT_RANK_LOST (its own process, at once, with the
    checkpoint writers it forked: the main thread is blocked in the collective).
  - a paused process (SIGSTOP of the whole job by a Slurm suspend, a paused VM) sees its heartbeat
    thread wake far later than asked: it moves its progress clock by the time it did not run and
    judges no other rank stale for a few beats, until they have written again.
  - a heartbeat file that cannot be written at the start is one sentence on every rank
    (`agree_writable`); a rank whose own writes fail later names no other rank from stale files (it
    says that the files cannot be written instead).
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
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Optional

from megatron_mtp.errors import EXIT_RANK_LOST, RunError, sentence
from megatron_mtp.runtime.heartbeats import (
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
        "Socket Timeout", "Timed out waiting"))


PAUSED_S = 1.0
"""The heartbeat thread woke this much later than asked: the process (or its machine) was paused."""
_exit = os._exit
"""How a rank ends (a module attribute, so that the unit tests of the rule can watch it instead)."""



class Watchdog:
    """This rank's heartbeat thread, and the hang rule (module note)."""

    def __init__(self, run_dir: Path, rank: int, world: int, hang_timeout: float, launch_id: int = 0,
                 saves: Optional[Callable[[], Optional[tuple]]] = None, step: int = 0):
        """`step`: the step training starts from; `saves`: what the rank's checkpoint writer has done,
        (step, bytes written, bytes planned, complete), or None when no save is being written
        (CheckpointSaver.write_progress)."""
        self.run_dir, self.rank, self.world, self.hang_timeout = run_dir, rank, world, hang_timeout
        self.beat_s = min(10.0, max(0.5, hang_timeout / 6)) if hang_timeout else 10.0
        self.file = heartbeat_file(run_dir, rank)
        self.claim_file = self.file.with_name(f"ended-{launch_id}")
        self.saves = saves
        self.step, self.doing = step, "the start of training"
        self.progress_at = time.time()  # watched from the start: a hang in the first step is one too
        self.writer: Optional[dict] = None
        self.write_error: Optional[str] = None
        self.grace_until = 0.0
        self._stop = threading.Event()
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.write_error = f"{type(exc).__name__}: {exc.strerror or exc}"
        self._write()
        self._thread = threading.Thread(target=self._run, name="megatron-mtp-heartbeat", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------ main thread
    def progress(self, step: int, doing: str) -> None:
        """A step, save or evaluation ended; `doing`: what comes next."""
        self.step, self.doing, self.progress_at = step, doing, time.time()

    def now_doing(self, doing: str) -> None:
        self.doing = doing

    def agree_writable(self) -> None:
        """Every rank at once: one sentence when a rank cannot write its heartbeat file (the ranks would
        otherwise blame it for a hang it does not have)."""
        import torch

        from megatron_mtp.platform import all_reduce_sum

        failed = torch.zeros(self.world)
        failed[self.rank] = float(self.write_error is not None)
        ranks = [rank for rank, bad in enumerate(all_reduce_sum(failed).tolist()) if bad]
        if ranks:
            names = ", ".join(map(str, ranks[:8])) + (f" and {len(ranks) - 8} more" if len(ranks) > 8 else "")
            own = f" ({self.write_error} on rank {self.rank})" if self.write_error else ""
            raise RunError(f"rank {names} cannot write its heartbeat file in {self.file.parent}{own}; the watchdog "
                           "that names hung and lost ranks needs that directory writable by every rank: check its "
                           "permissions and free space, then run the same command again")

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
        while time.time() < deadline and self.write_error is None:
            lost = self._stale(read_heartbeats(self.run_dir, self.world), time.time())
            if lost:
                break
            time.sleep(min(0.5, self.beat_s))
        if lost and os.environ.get(LAUNCHER_NAMES_DEAD_RANKS) == "1" and self._all_gone(lost):
            self._end(None)  # the local launcher names the rank with its signal (launch/local.py)
        if lost:
            what = self._describe_lost(lost, time.time(), "died or stopped")
        else:
            cause = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else type(exc).__name__
            what = f"a collective failed on rank {self.rank} during {self.doing} ({cause}){self._unwritable()}"
        self._end(what)

    # ---------------------------------------------------------------- thread
    def _record(self) -> dict:
        doing, writer = self.doing, self.writer
        if writer is not None and doing.startswith("saving step"):
            mine = doing == f"saving step {writer['step']}"
            doing += f", {_bytes_done(writer)}" if mine else f", waiting for step {writer['step']}'s write " \
                                                             f"({_bytes_done(writer)})"
        return {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(), "step": self.step,
                "doing": doing, "progress_at": self.progress_at, "beat_at": time.time(), "writer": self.writer}

    def _write(self) -> None:
        tmp = self.file.with_name(self.file.name + ".tmp")
        try:
            tmp.write_text(json.dumps(self._record()))
            os.replace(tmp, self.file)
            self.write_error = None
        except OSError as exc:  # named at the start (agree_writable); later, no rank is blamed for it
            self.write_error = f"{type(exc).__name__}: {exc.strerror or exc}"

    def _watch_writer(self, now: float) -> None:
        """A save being written is progress while its bytes on disk grow."""
        try:
            probe = self.saves() if self.saves is not None else None
        except Exception:  # a save finishing under the probe: look again next beat
            return
        if probe is None:
            self.writer = None
            return
        step, written, planned, complete = probe
        before = self.writer
        if before is None or before["step"] != step:
            self.writer = {"step": step, "written": written, "planned": planned, "complete": complete, "at": now}
            return
        if written > before["written"]:
            before["at"] = self.progress_at = now
        before.update(written=written, planned=planned, complete=complete)

    def _run(self) -> None:
        last_wall, last = time.time(), time.monotonic()
        while not self._stop.wait(self.beat_s):
            now, mono = time.time(), time.monotonic()
            paused = max(now - last_wall, mono - last) - self.beat_s
            last_wall, last = now, mono
            if paused > PAUSED_S:  # this process did not run (SIGSTOP of the job, a paused VM): restart the clocks
                self.progress_at += paused
                if self.writer is not None:
                    self.writer["at"] += paused
                self.grace_until = now + (STALE_BEATS + 1) * self.beat_s + 1  # the others wake up too
            self._watch_writer(now)
            self._write()
            if self.hang_timeout and now - self.progress_at > self.hang_timeout and now >= self.grace_until:
                self._hung(now)

    def _stale(self, records: dict[int, dict], now: float) -> list[int]:
        limit = STALE_BEATS * self.beat_s + 1
        return [rank for rank in range(self.world) if rank != self.rank and (
            rank not in records or now - float(records[rank].get("beat_at", 0)) > limit or pid_gone(records[rank]))]

    def _all_gone(self, lost: list[int]) -> bool:
        records = read_heartbeats(self.run_dir, self.world)
        return all(rank in records and pid_gone(records[rank]) for rank in lost)

    def _unwritable(self) -> str:
        if self.write_error is None:
            return ""
        return (f" (the heartbeat files in {self.file.parent} cannot be written, {self.write_error}, so the rank "
                "that stopped cannot be named)")

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

    def _hung(self, now: float) -> None:
        """This rank made no progress for hang_timeout: end the job unless another rank still does."""
        records = read_heartbeats(self.run_dir, self.world)
        records[self.rank] = self._record()
        lost = [] if self.write_error else self._stale(records, now)
        if lost:
            if os.environ.get(LAUNCHER_NAMES_DEAD_RANKS) == "1" and self._all_gone(lost):
                self._end(None)  # ranks that exited: the local launcher names each with its signal
            self._end(self._describe_lost(lost, now, "is stopped"))
        latest = max(float(r.get("progress_at", 0)) for r in records.values())
        if now - latest <= self.hang_timeout:
            return  # another rank is making progress (its checkpoint writer, say): this one waits for it
        stuck = [r for r in records.values() if r.get("writer") and not r["writer"].get("complete")]
        if stuck:
            parts = [f"rank {r['rank']}'s checkpoint writer made no progress for {now - r['writer']['at']:.0f} s "
                     f"(training.hang_timeout={self.hang_timeout:g}) while saving step {r['writer']['step']}, with "
                     f"{_bytes_done(r['writer'])}" for r in stuck[:4]]
            what = f"{'; '.join(parts)}: its filesystem is stalled or the writer is hung"
        else:
            doing = sorted({str(r.get("doing")) for r in records.values()})
            what = (f"no rank has made progress for {now - latest:.0f} s (training.hang_timeout="
                    f"{self.hang_timeout:g}), after step {min(int(r.get('step', 0)) for r in records.values())}; "
                    f"every rank is alive and waiting ({'; '.join(doing)}){self._unwritable()}")
        self._end(what)

    def _claim(self) -> bool:
        """Whether this rank says the job's last sentence: the first rank to decide creates the claim file."""
        try:
            fd = os.open(self.claim_file, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        except OSError:  # no claim file possible: the lowest rank still reporting says it
            records = read_heartbeats(self.run_dir, self.world)
            alive = [self.rank] + [r for r in records if r not in self._stale(records, time.time())]
            return self.rank == min(alive)
        os.write(fd, f"{self.rank}\n".encode())
        os.close(fd)
        return True

    def _end(self, what: Optional[str]) -> None:
        """Print `what` (when this rank is the first to decide) and end this rank's process at once."""
        if what is not None and self._claim():
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
        _kill_descendants(os.getpid())  # its checkpoint writers would outlive it, stuck on what stopped them
        _exit(EXIT_RANK_LOST)


def _kill_descendants(pid: int) -> None:
    """SIGKILL every process forked from `pid` (Linux /proc; nothing elsewhere)."""
    if _exit is not os._exit:  # the unit tests of the rule run it inside the test process
        return
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return
    for task in tasks:
        try:
            children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
        except OSError:
            continue
        for child in map(int, children):
            _kill_descendants(child)
            try:
                os.kill(child, signal.SIGKILL)
            except OSError:
                pass


def _bytes_done(writer: dict) -> str:
    from megatron_mtp.write_causes import size_text

    planned = f" of about {size_text(writer['planned'])}" if writer.get("planned") else ""
    return f"{size_text(writer['written'])}{planned} written"
