"""Warm worker jobs for the test suite: one per world size, started on first use, kept for the session.

`run(argv, nproc=N)` runs a python command line (`["-m", "megatron_mtp", "train", ...]`, a script,
or `["-c", code]`) on every rank of the N-rank job and returns a `subprocess.CompletedProcess` with
rank 0's stdout and stderr (the other ranks' stderr is appended when they exited otherwise), as a
`torchrun` of the same command would have given. The command runs in this process's current
environment and directory. A command that leaves the job broken (a rank crashed, or the ranks
stopped meeting) fails alone: its result carries every rank's output and traceback, and the next
command gets a new job. The design note is in worker.py.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = Path(__file__).with_name("worker.py")
# a job whose rank has grown past this (memory that a command's libraries keep, heap fragmentation) is
# replaced before the next command: 15 warm ranks must fit in a 24 GiB machine beside the tests
RSS_LIMIT = 2 << 30
# likewise a job whose rank holds more threads than this: each process group that outlives its command
# keeps gloo threads that wake up on their own, and hundreds of them load 2 cores (the worker cuts the
# known causes; this bounds any new one)
THREAD_LIMIT = 150
# before a new job starts, the least recently used other jobs are closed while the machine has less memory
# available than this per rank of the new job (plus the headroom): the suite runs in several pytest
# processes at once (tools/test.sh), each with its own warm jobs, and together they must not exhaust memory
MEMORY_PER_RANK = 1536 << 20
MEMORY_HEADROOM = 3 << 30
ROOT = Path(__file__).resolve().parents[2]


class PoolJobFailed(AssertionError):
    """The job died or hung while running a command."""


class WorkerJob:
    """One N-rank job and the requests it has served."""

    def __init__(self, nproc: int):
        self.nproc = nproc
        self.dir = Path(tempfile.mkdtemp(prefix=f"megatron_mtp_workers{nproc}_"))
        self.next = 0
        self.rss = self.threads = 0  # the largest rank's resident memory and thread count after the last command
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", WORKER_POOL_OWNER=str(os.getpid()),
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        if nproc == 1:
            # port 0: the one rank's store binds a free port itself, so no other process of the machine (the
            # other lane's jobs) can take it between a free_port() look-up and the bind (EADDRINUSE)
            env.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", MASTER_ADDR="127.0.0.1",
                       MASTER_PORT="0")
            cmd = [sys.executable, str(WORKER), str(self.dir)]
        else:
            # --standalone: torchrun's agent binds its store on a free port itself (the same reason)
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc),
                   str(WORKER), str(self.dir)]
        self.log = open(self.dir / "job.log", "w")
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, env=env, cwd=ROOT,
                                     start_new_session=True)

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            return False
        for r in range(self.nproc):
            pid_file = self.dir / f"pid-{r}"
            try:
                pid = int(pid_file.read_text())
            except (FileNotFoundError, ValueError):  # the rank has not started yet
                continue
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return False
        return True

    def run(self, argv: list[str], timeout: float, sync_timeout: float, env: dict | None = None,
            cwd: str | None = None) -> subprocess.CompletedProcess:
        n = self.next
        self.next += 1
        request = {"argv": [str(a) for a in argv], "env": {**os.environ, **(env or {})}, "cwd": str(cwd or os.getcwd())}
        tmp = self.dir / f"req-{n}.tmp"
        tmp.write_text(json.dumps(request))
        os.replace(tmp, self.dir / f"req-{n}.json")
        deadline = time.monotonic() + timeout
        delay, failed_at = 0.002, None
        while True:
            finished = [r for r in range(self.nproc) if (self.dir / str(n) / f"rank-{r}.json").exists()]
            if len(finished) == self.nproc:
                break
            if not self.alive():
                time.sleep(0.2)  # let the ranks that are still writing finish their files
                self.kill()
                raise PoolJobFailed(self._report(n, argv, "the job died while running it"))
            now = time.monotonic()
            if now > deadline:
                self.kill()
                raise PoolJobFailed(self._report(n, argv, f"it did not finish within {timeout:.0f} s"))
            if failed_at is None and any(self._rank_files(n, r)[2]["returncode"] != 0 for r in finished):
                failed_at = now
            if failed_at is not None and now - failed_at > sync_timeout:  # the others wait for it in a collective
                self.kill()
                raise PoolJobFailed(self._report(n, argv, f"a rank failed and the others did not finish within "
                                                          f"{sync_timeout:.0f} s"))
            time.sleep(delay)
            delay = min(delay * 1.5, 0.05)
        return self._result(n, argv)

    def _rank_files(self, n: int, rank: int) -> tuple[str, str, dict | None]:
        out_dir = self.dir / str(n)

        def text(name):
            path = out_dir / name
            return path.read_text(errors="replace") if path.exists() else ""

        info = out_dir / f"rank-{rank}.json"
        result = json.loads(info.read_text()) if info.exists() else None
        return text(f"rank-{rank}.out"), text(f"rank-{rank}.err"), result

    def _result(self, n: int, argv: list[str]) -> subprocess.CompletedProcess:
        ranks = [self._rank_files(n, r) for r in range(self.nproc)]
        codes = [info["returncode"] for _, _, info in ranks]
        code = codes[0] if codes[0] != 0 else next((c for c in codes if c != 0), 0)
        stdout, stderr = ranks[0][0], ranks[0][1]
        for r, (_, err, info) in enumerate(ranks[1:], start=1):
            if info["returncode"] != codes[0] and err:
                stderr += f"\n[rank {r}, exit code {info['returncode']}]\n{err}"
        proc = subprocess.CompletedProcess(argv, code, stdout, stderr)
        proc.ranks = ranks
        self.rss = max(info.get("rss_bytes", 0) for _, _, info in ranks)
        self.threads = max(info.get("threads", 0) for _, _, info in ranks)
        return proc

    def _report(self, n: int, argv: list[str], what: str) -> str:
        parts = [f"`{' '.join(map(str, argv))}` on {self.nproc} warm rank(s): {what}"]
        for r in range(self.nproc):
            out, err, info = self._rank_files(n, r)
            status = f"exit code {info['returncode']}" if info else "did not finish"
            parts.append(f"--- rank {r} ({status}) stdout:\n{out[-3000:]}\n--- rank {r} stderr:\n{err[-6000:]}")
        self.log.flush()
        parts.append(f"--- job log:\n{(self.dir / 'job.log').read_text(errors='replace')[-4000:]}")
        return "\n".join(parts)

    def kill(self) -> None:
        """End the job, its ranks (torchrun starts each rank in a session of its own) and what the ranks
        started (a checkpoint writer's manager process would outlive them)."""
        for proc in self._rank_processes():
            try:
                proc.kill()
            except Exception:  # psutil.Error: gone already
                pass
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def _rank_processes(self) -> list:
        """The ranks and every process they started (psutil.Process objects)."""
        import psutil

        procs = []
        for r in range(self.nproc):
            try:
                rank = psutil.Process(int((self.dir / f"pid-{r}").read_text()))
                procs += [rank, *rank.children(recursive=True)]
            except (OSError, ValueError, psutil.Error):
                pass
        return procs

    def close(self) -> None:
        """Ask the ranks to leave, then make sure they did, and that nothing they started stays behind
        (a checkpoint writer's manager process outlives its rank); remove the job's files."""
        started = self._rank_processes()
        if self.proc.poll() is None:
            stop = self.dir / f"req-{self.next}.json"
            stop.write_text(json.dumps({"stop": True}))
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self.kill()
        for proc in started:
            try:
                proc.kill()
            except Exception:  # psutil.Error: ended with its rank
                pass
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class WorkerPool:
    def __init__(self):
        self.jobs: dict[int, WorkerJob] = {}
        self.used: dict[int, float] = {}  # when each job last served a command

    def _make_room(self, nproc: int) -> None:
        """Close this pool's least recently used jobs while the machine lacks memory for ``nproc`` more ranks."""
        while self.jobs and _available_memory() < nproc * MEMORY_PER_RANK + MEMORY_HEADROOM:
            oldest = min(self.jobs, key=lambda n: self.used.get(n, 0.0))
            self.jobs.pop(oldest).close()

    def run(self, argv: list[str], nproc: int = 1, timeout: float = 900, sync_timeout: float = 60,
            check: bool = False, env: dict | None = None, cwd: str | Path | None = None) -> subprocess.CompletedProcess:
        """Run `argv` on a warm job of `nproc` ranks (see the module docstring), with `env` added to
        this process's environment and in `cwd` (default: this process's). A job that breaks (it dies,
        passes `timeout`, or its other ranks run on `sync_timeout` seconds after one rank failed) is
        replaced for the next call; this call then raises PoolJobFailed with every rank's output;
        `check` raises AssertionError with the output when the command exits non-zero."""
        job = self.jobs.get(nproc)
        if job is None or not job.alive() or job.rss > RSS_LIMIT or job.threads > THREAD_LIMIT:
            if job is not None:
                job.close()
                del self.jobs[nproc]
            self._make_room(nproc)
            job = self.jobs[nproc] = WorkerJob(nproc)
        self.used[nproc] = time.monotonic()
        try:
            proc = job.run(argv, timeout, sync_timeout, env, cwd)
        except PoolJobFailed:
            job.close()
            del self.jobs[nproc]
            raise
        if check and proc.returncode != 0:
            raise AssertionError(f"`{' '.join(map(str, argv))}` failed ({proc.returncode}) on {nproc} rank(s):\n"
                                 f"{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
        return proc

    def close(self) -> None:
        for job in self.jobs.values():
            job.close()
        self.jobs.clear()


def _available_memory() -> int:
    """MemAvailable of /proc/meminfo in bytes (as much as asked for where it cannot be read)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) << 10
    except OSError:
        pass
    return 1 << 62


POOL = WorkerPool()
atexit.register(POOL.close)
