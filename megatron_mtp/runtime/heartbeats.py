"""The heartbeat files the trainer's ranks write (training/watchdog.py) and the launcher reads.

RUN_DIR/logs/heartbeat/rank-NNNNN.json, rewritten every few seconds by a thread of each rank: its host,
pid, the last step it finished, what it is doing and when it last made progress. Here sit the file's
place and its readers, below both the trainer and the launcher (runtime/: what ranks and launchers share).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

from megatron_mtp.runtime.liveness import process_gone

HEARTBEAT_DIR = Path("logs") / "heartbeat"
LAUNCHER_NAMES_DEAD_RANKS = "MEGATRON_MTP_LAUNCHER_NAMES_DEAD_RANKS"
"""Set to 1 by the local launcher, which names a rank that a signal killed itself (with the signal)."""
STALE_BEATS = 3
"""A heartbeat this many beats old (plus a second) belongs to a rank that is stopped or gone."""


def heartbeat_file(run_dir: Path, rank: int) -> Path:
    return run_dir / HEARTBEAT_DIR / f"rank-{rank:05d}.json"


def read_heartbeats(run_dir: Path, world: int) -> dict[int, dict]:
    """{rank: record} of the ranks of a job of `world` ranks that wrote one."""
    records = {}
    for rank in range(world):
        try:
            records[rank] = json.loads(heartbeat_file(run_dir, rank).read_text())
        except (OSError, ValueError):
            continue
    return records


def pid_gone(record: dict) -> bool:
    """Whether the rank that wrote ``record`` has certainly exited (runtime/liveness.py: decidable on its own
    host only)."""
    return record.get("host") is not None and process_gone(record["host"], record.get("pid"))


def exit_note(run_dir: Path, world: int, rank: int) -> Optional[str]:
    """'after step S during X' from a rank's last heartbeat (for the launcher's sentence on a dead rank)."""
    record = read_heartbeats(run_dir, world).get(rank)
    if record is None:
        return None
    return f"after step {record.get('step')} during {record.get('doing')}"
