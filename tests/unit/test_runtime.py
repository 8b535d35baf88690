"""The one file lock and the one liveness check that writers, builders and launchers share."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from megatron_mtp.runtime.file_lock import exclusive_lock, held_by_another, try_hold
from megatron_mtp.runtime.liveness import pid_alive, process_gone


def test_a_process_is_gone_only_once_it_has_ended_on_this_host():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert pid_alive(child.pid)
        assert not process_gone(None, child.pid) and not process_gone(socket.gethostname(), str(child.pid))
    finally:
        child.kill()
        child.wait()
    assert not pid_alive(child.pid)
    assert process_gone(None, child.pid) and process_gone(socket.gethostname(), child.pid)
    assert not process_gone("another-host.invalid", child.pid)  # cannot be checked from here
    assert not process_gone(None, "not-a-pid")


def test_a_held_lock_is_seen_and_waited_for(tmp_path):
    path = tmp_path / "build.lock"
    assert not held_by_another(path)  # no file yet
    order = []
    with exclusive_lock(path):
        assert held_by_another(path)

        def second():
            with exclusive_lock(path):
                order.append("second")

        thread = threading.Thread(target=second)
        thread.start()
        time.sleep(0.3)
        order.append("first")
    thread.join(10)
    assert order == ["first", "second"]
    assert not held_by_another(path)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert try_hold(fd) and held_by_another(path)
    finally:
        os.close(fd)


def test_a_directory_is_locked_itself_and_best_effort_goes_on_without_a_lock(tmp_path):
    with exclusive_lock(tmp_path):
        assert held_by_another(tmp_path)
    assert list(tmp_path.iterdir()) == []  # no lock file was made inside
    missing = tmp_path / "no" / "such.lock"
    with exclusive_lock(missing, best_effort=True):
        pass
    with pytest.raises(FileNotFoundError):
        with exclusive_lock(missing):
            pass
