"""The hang rule of training/watchdog.py on real Watchdog objects, real heartbeat files and real short
timings: when it fires (from the first step, and not while a checkpoint writer adds bytes), what it
says, that one rank alone says it, and that a paused process does not blame anyone.

A Watchdog ends its process with os._exit; here its module's `_exit` records the end and stops the
heartbeat thread instead (SystemExit ends a thread quietly)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from megatron_mtp.runtime.heartbeats import LAUNCHER_NAMES_DEAD_RANKS
from megatron_mtp.training import watchdog as wd

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # see the note


@pytest.fixture
def ends(monkeypatch):
    """[(time, thread name, exit code)] of the watchdogs that ended their 'process'."""
    seen: list = []

    def record(code):
        seen.append((time.time(), threading.current_thread().name, code))
        raise SystemExit(code)

    monkeypatch.setattr(wd, "_exit", record)
    return seen


def _wait(ends, count, timeout):
    deadline = time.time() + timeout
    while len(ends) < count and time.time() < deadline:
        time.sleep(0.02)
    return ends


def _errors(capfd) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if "error:" in line]


def test_no_progress_from_the_start_ends_the_job_within_the_timeout_and_a_few_beats(tmp_path, ends, capfd):
    """Watched from its start (a hang in the first step counts); it fires after hang_timeout, not 10× later."""
    timeout = 1.0
    started = time.time()
    dog = wd.Watchdog(tmp_path, 0, 1, timeout, launch_id=7)
    try:
        _wait(ends, 1, 20 * timeout)
    finally:
        dog.stop()
    assert ends and ends[0][2] == wd.EXIT_RANK_LOST
    elapsed = ends[0][0] - started
    assert timeout <= elapsed <= timeout + 2 * dog.beat_s + 1.0, elapsed
    (line,) = _errors(capfd)
    assert "no rank has made progress for 1 s (training.hang_timeout=1), after step 0" in line, line
    assert "ending the job (exit 76)" in line, line


def test_a_save_whose_writer_adds_bytes_is_progress_and_a_writer_that_stops_is_named(tmp_path, ends, capfd):
    timeout, grows_for = 1.0, 3.0
    started = time.time()

    def writer():  # 1 KB more each time it is asked, for 3 s, then nothing
        return 4, int(min(time.time() - started, grows_for) * 1000), 10 << 20, False

    dog = wd.Watchdog(tmp_path, 0, 1, timeout, launch_id=8, saves=writer)
    dog.now_doing("saving step 4")
    try:
        time.sleep(grows_for - 0.5)
        beat = json.loads((tmp_path / "logs" / "heartbeat" / "rank-00000.json").read_text())
        assert not ends  # 2.5 s without a step, but the writer is writing
        _wait(ends, 1, 20 * timeout)
    finally:
        dog.stop()
    assert beat["doing"].startswith("saving step 4, 0.0 MiB of about 10.0 MiB written"), beat
    elapsed = ends[0][0] - started
    assert grows_for + timeout <= elapsed + dog.beat_s <= grows_for + timeout + 3 * dog.beat_s + 1.0, elapsed
    (line,) = _errors(capfd)
    assert "rank 0's checkpoint writer made no progress for 1 s (training.hang_timeout=1) while saving step 4, " \
           "with 0.0 MiB of about 10.0 MiB written" in line, line


def test_the_first_rank_to_decide_says_the_sentence_and_the_others_end_quietly(tmp_path, ends, capfd, monkeypatch):
    """Rank 1 decides first and exits; rank 0 then finds it gone. Before the claim, rank 1 left the sentence
    to the lowest live rank, and rank 0 to the launcher (which names only a rank a signal killed): none."""
    monkeypatch.setenv(LAUNCHER_NAMES_DEAD_RANKS, "1")
    beats = tmp_path / "logs" / "heartbeat"
    beats.mkdir(parents=True)

    def rank0_record(pid):
        (beats / "rank-00000.json").write_text(json.dumps({
            "rank": 0, "host": socket.gethostname(), "pid": pid, "step": 3, "doing": "step 4",
            "progress_at": time.time() - 30, "beat_at": time.time()}))

    rank0_record(os.getpid())  # rank 0 alive and waiting, like rank 1
    rank1 = wd.Watchdog(tmp_path, 1, 2, 1.0, launch_id=9)
    try:
        _wait(ends, 1, 20)
    finally:
        rank1.stop()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (beats / "rank-00001.json").write_text(json.dumps({  # rank 1's process has exited
        "rank": 1, "host": socket.gethostname(), "pid": dead.pid, "step": 3, "doing": "step 4",
        "progress_at": time.time() - 30, "beat_at": time.time()}))
    rank0 = wd.Watchdog(tmp_path, 0, 2, 1.0, launch_id=9)
    try:
        _wait(ends, 2, 20)
    finally:
        rank0.stop()
    assert len(ends) == 2 and all(code == wd.EXIT_RANK_LOST for _, _, code in ends)
    (line,) = _errors(capfd)
    assert "no rank has made progress" in line and "(step 4; the start of training)" in line, line
    assert (beats / "ended-9").read_text().strip() == "1"


def test_a_paused_process_restarts_its_clocks_instead_of_blaming(tmp_path):
    """SIGSTOP of the whole process for 4 s (a suspended job, a paused VM) with hang_timeout=2: the time it
    did not run does not count, so it goes on; counted, it would end the job the moment it woke."""
    code = textwrap.dedent(f"""
        import sys, time
        from pathlib import Path
        from megatron_mtp.training.watchdog import Watchdog
        dog = Watchdog(Path({str(tmp_path)!r}), 0, 1, 2.0)
        print("ready", flush=True)
        sys.stdin.readline()  # no progress while the test pauses this process
        dog.progress(1, "step 2")
        dog.stop()
        print("went on", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGSTOP)
        time.sleep(4)
        proc.send_signal(signal.SIGCONT)
        time.sleep(0.5)
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0 and "went on" in out, (proc.returncode, out, err)
    assert "error:" not in err, err
