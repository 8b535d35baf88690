"""Slurm time-limit strings (``--time``): parsing and validation.

Slurm accepts ``M``, ``M:S``, ``H:M:S``, ``D-H``, ``D-H:M`` and ``D-H:M:S``; ``UNLIMITED`` and
``INFINITE`` mean no limit. We parse to seconds so the warning signal can be checked against it.
"""

from __future__ import annotations

import re
from typing import Optional

from megatron_mtp.errors import UserError

_UNLIMITED = {"unlimited", "infinite"}
_DAYS = re.compile(r"^(\d+)-(\d+)(?::(\d+))?(?::(\d+))?$")
_CLOCK = re.compile(r"^(\d+)(?::(\d+))?(?::(\d+))?$")


def parse_slurm_time(text: str) -> Optional[int]:
    """Seconds in a Slurm time limit, or None for an unlimited one; UserError when malformed."""
    value = text.strip()
    if value.lower() in _UNLIMITED:
        return None
    match = _DAYS.match(value)
    if match:
        days, hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
        _check_ranges(text, hours=hours, minutes=minutes, seconds=seconds)
        total = ((days * 24 + hours) * 60 + minutes) * 60 + seconds
    else:
        match = _CLOCK.match(value)
        if not match:
            raise UserError(
                f"--time '{text}' is not a Slurm time limit; use minutes, MM:SS, HH:MM:SS, "
                "D-HH, D-HH:MM or D-HH:MM:SS (for example 4:00:00 or 2-00:00:00)"
            )
        parts = [int(g) for g in match.groups() if g is not None]
        _check_ranges(text, minutes=parts[1] if len(parts) == 3 else None,
                      seconds=parts[-1] if len(parts) > 1 else None)
        if len(parts) == 1:
            total = parts[0] * 60
        elif len(parts) == 2:
            total = parts[0] * 60 + parts[1]
        else:
            total = (parts[0] * 60 + parts[1]) * 60 + parts[2]
    if total <= 0:
        raise UserError(f"--time '{text}' is zero; give the job a positive time limit")
    return total


def _check_ranges(text: str, hours: Optional[int] = None, minutes: Optional[int] = None,
                  seconds: Optional[int] = None) -> None:
    """Past the leading field, hours run to 23 and minutes and seconds to 59 (as sbatch requires)."""
    for name, value, top in (("hours", hours, 23), ("minutes", minutes, 59), ("seconds", seconds, 59)):
        if value is not None and value > top:
            raise UserError(f"--time '{text}' has {value} {name}; {name} after the leading field run from 0 to {top} "
                            "(for example 4:00:00 or 2-00:00:00)")


def format_seconds(seconds: int) -> str:
    """Human form used in messages: 1-02:03:04 or 02:03:04."""
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    clock = f"{hours:02d}:{minutes:02d}:{secs:02d}"
    return f"{days}-{clock}" if days else clock
