"""Where checkpoints live in a run directory, and which checkpoint a user's path names.

    RUN_DIR/checkpoints/step_NNNNNNN/   one complete checkpoint (torch_dist shards, metadata.json,
                                        config.yaml, train_state.json, tokenizer/)
    RUN_DIR/checkpoints/step_N.tmp/     a save in progress (never read)
    RUN_DIR/checkpoints/latest          the name of the newest complete step, replaced atomically

Every command that takes a checkpoint (train's resume and checkpoint.load, eval, convert,
drop-mtp, generate, submit) resolves it here, so all accept the same four spellings: a run
directory, its ``checkpoints/`` directory, a ``step_N`` directory, or the ``latest`` file. A
checkpoint is complete when its torch_dist index, config and train state are all present.
When ``latest`` is missing or names something incomplete, the newest complete step is used and
the resolution says so: a run is never restarted from scratch beside good checkpoints.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from megatron_mtp.errors import UserError

CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "train_state.json"
CONFIG_FILE = "config.yaml"
TOKENIZER_DIR = "tokenizer"
TORCH_DIST_MARKER = "metadata.json"  # written by megatron-core's dist_checkpointing.save
REQUIRED_FILES = (TORCH_DIST_MARKER, CONFIG_FILE, STATE_FILE)
_STEP_RE = re.compile(r"^step_(\d+)$")


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def missing_files(step_dir: Path) -> list[str]:
    """The files a complete checkpoint has that ``step_dir`` lacks (all of them if it is no directory)."""
    if not step_dir.is_dir():
        return list(REQUIRED_FILES)
    return [name for name in REQUIRED_FILES if not (step_dir / name).is_file()]


def is_complete(step_dir: Path) -> bool:
    return not missing_files(step_dir)


def complete_steps(ckpt_root: Path) -> list[Path]:
    """Complete ``step_N`` directories under ``ckpt_root``, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for child in ckpt_root.iterdir():
        match = _STEP_RE.match(child.name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


@dataclass(frozen=True)
class Resolved:
    """A complete checkpoint directory, and why it was chosen when ``latest`` could not be used."""

    path: Path
    note: Optional[str] = None


def _from_root(ckpt_root: Path) -> Optional[Resolved]:
    """The checkpoint a ``checkpoints/`` directory designates (None if it holds none at all)."""
    latest = ckpt_root / LATEST
    problem = None
    if latest.is_file():
        name = latest.read_text(errors="replace").strip()
        target = ckpt_root / name
        if name and "/" not in name and is_complete(target):
            return Resolved(target)
        problem = f"{latest} names '{name}', which is not a complete checkpoint"
    steps = complete_steps(ckpt_root)
    if steps:
        newest = steps[-1]
        why = problem or f"{ckpt_root} has no {LATEST} file"
        return Resolved(newest, f"{why}; using the newest complete checkpoint {newest.name}")
    if problem:
        raise UserError(f"{problem}, and no other complete checkpoint is in {ckpt_root}; restore that "
                        f"checkpoint, or remove {latest} to start over")
    return None


def find_checkpoint(path: str | os.PathLike) -> Optional[Resolved]:
    """The checkpoint ``path`` designates, or None when ``path`` holds no checkpoint at all.

    ``path``: a run directory, its checkpoints/ directory, a step directory or a ``latest`` file.
    Raises UserError when ``path`` is a checkpoint that is incomplete or names one that is.
    """
    path = Path(path)
    if path.is_file() and path.name == LATEST:
        return _from_root(path.parent)
    if not path.is_dir():
        return None
    if (path / STATE_FILE).is_file() or (path / TORCH_DIST_MARKER).is_file():
        missing = missing_files(path)
        if missing:
            raise UserError(f"checkpoint {path} is incomplete ({', '.join(missing)} missing); "
                            "pass another checkpoint or the run directory")
        return Resolved(path)
    for root in (path / CHECKPOINTS_DIR, path):
        found = _from_root(root)
        if found is not None:
            return found
    return None


def resolve_checkpoint(path: str | os.PathLike, what: str = "checkpoint") -> Resolved:
    """``find_checkpoint`` for a path the user gave: a path without a checkpoint is an error."""
    if not Path(path).exists():
        raise UserError(f"{what} '{path}' does not exist")
    found = find_checkpoint(path)
    if found is None:
        raise UserError(f"{what} '{path}' holds no checkpoint; pass a run directory, its checkpoints/ "
                        "directory, a checkpoints/step_N directory or the checkpoints/latest file")
    return found
