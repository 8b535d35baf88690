"""How the local launcher (launch/local.py) names a rank a signal ended, on real child processes."""

from __future__ import annotations

import signal
import subprocess
import sys

from megatron_mtp.errors import EXIT_RANK_LOST, is_one_sentence
from megatron_mtp.launch import local


def _sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def _said(capfd) -> str:
    (line,) = [line for line in capfd.readouterr().err.splitlines() if "error:" in line]
    assert is_one_sentence(line.split(" error: ", 1)[1]), line
    return line


def test_a_signal_passed_on_before_the_rank_could_save_is_named_as_such(capfd):
    """A SIGTERM the launcher forwarded while the rank was still starting (no save-and-exit handler yet)
    is the user's own request, not 'out of memory, or killed by someone'."""
    rank = _sleeper()
    rank.send_signal(signal.SIGTERM)
    local._wait([rank], None, [signal.SIGINT])  # Ctrl-C at the launcher, passed on as SIGTERM
    line = _said(capfd)
    assert f"rank 0 (pid {rank.pid}) was killed by SIGTERM, which this launcher passed on before the rank could " \
           "save" in line, line
    assert "rerun the same command to resume from the latest checkpoint" in line and "out of memory" not in line


def test_each_signal_is_named_with_what_usually_sends_it(capfd):
    for sig, why in ((signal.SIGKILL, "the kernel's out-of-memory killer, or someone's kill -9"),
                     (signal.SIGSEGV, "a crash in native code"),
                     (signal.SIGTERM, "sent by someone or by the system, not through this launcher")):
        rank = _sleeper()
        rank.send_signal(sig)
        local._wait([rank], None, [])
        line = _said(capfd)
        assert f"was killed by {sig.name} ({why}" in line, line


def test_a_killed_rank_is_named_even_when_a_lower_rank_ended_76_first(capfd):
    """The watchdog of a rank that finds a peer's process gone ends quietly with 76 and leaves the sentence to
    the launcher, which must then name the killed rank whatever the order it sees them end in."""
    killed = _sleeper()
    killed.send_signal(signal.SIGKILL)
    killed.wait()
    quiet = subprocess.Popen([sys.executable, "-c", f"import sys; sys.exit({EXIT_RANK_LOST})"])
    quiet.wait()
    assert local._wait([quiet, killed], None, []) == EXIT_RANK_LOST
    line = _said(capfd)
    assert f"rank 1 (pid {killed.pid}) was killed by SIGKILL" in line, line
