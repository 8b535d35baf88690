"""Config checks of when a run saves and how long it waits (part of validate.validate)."""

from __future__ import annotations

from megatron_mtp.config.root import Config
from megatron_mtp.errors import UserError

MIN_HANG_TIMEOUT = 1.0
"""The shortest training.hang_timeout (seconds) but 0: the watchdog polls every half second, and a
shorter limit would call every step a hang."""


def check_intervals_and_timeouts(cfg: Config) -> None:
    """One sentence for a save interval or a timeout no run can mean."""
    t, c = cfg.training, cfg.checkpoint
    if not t.collective_timeout > 0:
        raise UserError(f"training.collective_timeout is {t.collective_timeout}; it must be a positive number of "
                        "seconds")
    if c.save_interval < 0:
        raise UserError(f"checkpoint.save_interval is {c.save_interval}; it must be 0 (save only at the end) or a "
                        "positive number of steps")
    if c.save_interval_minutes < 0:
        raise UserError(f"checkpoint.save_interval_minutes is {c.save_interval_minutes}; it must be 0 (off) or a "
                        "positive number of minutes")
    if t.hang_timeout != 0 and not t.hang_timeout >= MIN_HANG_TIMEOUT:
        raise UserError(f"training.hang_timeout is {t.hang_timeout}; it must be 0 (off) or at least "
                        f"{MIN_HANG_TIMEOUT:g} second (and above the longest step, evaluation and save)")
