"""Whether a process that left a mark (a temporary's name, a heartbeat record) still runs.

One answer for every caller: a process of this host is alive while ``kill(pid, 0)`` finds it (one of
another user's counts as alive); a process of another host cannot be checked from here and is never
called gone.
"""

from __future__ import annotations

import os
import socket
from typing import Optional


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host runs (one of another user's counts as running)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


def process_gone(host: Optional[str], pid: object) -> bool:
    """True only when process ``pid`` of ``host`` (None: this host) certainly no longer runs: it is on
    this host, its pid is a number, and no such process exists."""
    if host is not None and host != socket.gethostname():
        return False
    try:
        number = int(pid)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return False
    return not pid_alive(number)
