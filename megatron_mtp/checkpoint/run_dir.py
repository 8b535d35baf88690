"""Where checkpoints live in a run directory, and which checkpoint a user's path names.

    RUN_DIR/checkpoints/step_NNNNNNN/   one complete checkpoint (torch_dist shards, metadata.json,
                                        config.yaml, train_state.json, tokenizer/, manifest.json)
    RUN_DIR/checkpoints/step_N.tmp/     a save in progress (never read)
    RUN_DIR/checkpoints/latest          the name of the newest complete step, replaced atomically

Every command that takes a checkpoint (train's resume and checkpoint.load, eval, convert,
drop-mtp, generate, submit) resolves it here, so all accept the same four spellings: a run
directory, its ``checkpoints/`` directory, a ``step_N`` directory, or the ``latest`` file.
When ``latest`` is missing or names something incomplete, the newest complete step is used and
the resolution says so (naming what the skipped step lacks): a run is never restarted from
scratch beside good checkpoints. A ``step_N`` directory given directly that is incomplete is one
sentence naming the missing or truncated files.

Design note: when a checkpoint is complete. Every writer (the trainer's publish step, ``convert
from-hf``, ``drop-mtp``) ends with ``info.write_checkpoint_info``, whose last act, before the
directory gets its final name, is ``write_manifest``: ``manifest.json`` lists every file of the
checkpoint (relative path -> byte size) and the SHA-256 of each file but the editable records
(checkpoint/digests.py: checked at load, not here), written through a temp file and ``os.replace``. A
checkpoint with a manifest is complete when every listed file is present with its listed size
(a shorter or longer file was cut off or overwritten: megatron-core would fail deep inside the
load). Two kinds of files are exempt, because their readers parse and check them and name the file
in one sentence, and users may edit them: the text records ``config.yaml`` and ``train_state.json``
(presence only), and the optional ``hf_source/`` record of a converted model (not checked).
A checkpoint without a manifest (written before manifests existed, or whose manifest was lost)
is complete when ``metadata.json``, ``config.yaml``, ``train_state.json``, torch_dist's
``.metadata`` index and ``common.pt`` are present and every shard file the index names is at
least as long as the last byte it stores there (the check ``TorchDistReader.validate`` does).
"""

from __future__ import annotations

import json
import os
import pickle
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Optional

from megatron_mtp.checkpoint.digests import ALGORITHM, digest_of
from megatron_mtp.errors import UserError

CHECKPOINTS_DIR = "checkpoints"
LATEST = "latest"
STATE_FILE = "train_state.json"
CONFIG_FILE = "config.yaml"
TOKENIZER_DIR = "tokenizer"
MANIFEST_FILE = "manifest.json"
TORCH_DIST_MARKER = "metadata.json"  # written by megatron-core's dist_checkpointing.save
TORCH_DIST_INDEX = ".metadata"  # torch.distributed.checkpoint's index: tensor chunk -> (file, offset, length)
TORCH_DIST_COMMON = "common.pt"  # megatron-core's non-sharded part
REQUIRED_FILES = (TORCH_DIST_MARKER, CONFIG_FILE, STATE_FILE)
TEXT_RECORDS = (CONFIG_FILE, STATE_FILE)  # validated by their readers and editable: presence only
OPTIONAL_DIRS = ("hf_source",)  # convert's record of the HF source (convert/hf_source.py): not checked
_STEP_RE = re.compile(r"^step_(\d+)$")
_NAMED = 3  # files named in a problem before "and N more"


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def _digested(name: str) -> bool:
    """Whether a file's bytes are pinned by a digest (checkpoint/digests.py: all but the editable records)."""
    return name not in TEXT_RECORDS and name.split("/")[0] not in OPTIONAL_DIRS


def write_manifest(step_dir: Path, digests: Optional[dict[str, str]] = None) -> None:
    """Record every file of the checkpoint in ``step_dir``, its size and its digest; call it after all else
    is written. ``digests``: those the writing ranks computed (checkpoint/digests.py); the rest are
    computed here."""
    step_dir = Path(step_dir)
    tmp = step_dir / (MANIFEST_FILE + ".tmp")
    files, pinned = {}, {}
    for file in sorted(step_dir.rglob("*")):
        if file.is_file() and file not in (tmp, step_dir / MANIFEST_FILE):
            name = file.relative_to(step_dir).as_posix()
            files[name] = file.stat().st_size
            if _digested(name):
                pinned[name] = (digests or {}).get(name) or digest_of(file)
    record = {"files": files, "digest": ALGORITHM, "digests": pinned}
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, step_dir / MANIFEST_FILE)


def read_digests(step_dir: Path) -> Optional[tuple[dict[str, int], dict[str, str]]]:
    """({file: size}, {file: digest}) of the files a checkpoint's manifest pins, or None when it pins none
    (a checkpoint saved before digests existed, or written without a manifest: loaded unchecked)."""
    try:
        record = json.loads((Path(step_dir) / MANIFEST_FILE).read_text())
        pinned, sizes = record.get("digests"), record["files"]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if record.get("digest") != ALGORITHM or not isinstance(pinned, dict) or not pinned:
        return None
    return {name: sizes.get(name, 0) for name in pinned}, pinned


def _listed(names: list[str], what: str) -> str:
    shown = ", ".join(names[:_NAMED])
    more = f" and {len(names) - _NAMED} more" if len(names) > _NAMED else ""
    return f"{shown}{more} {what}"


def _describe(missing: list[str], wrong: list[tuple[str, int, int]], at_least: bool) -> Optional[str]:
    parts = [_listed(missing, "missing")] if missing else []
    if wrong:
        name, size, expected = wrong[0]
        if size < expected:
            text = f"{name} truncated ({size} of {'at least ' if at_least else ''}{expected} bytes)"
        else:
            text = f"{name} has {size} bytes, not {expected}"
        parts.append(text + (f", and {len(wrong) - 1} more of another size" if len(wrong) > 1 else ""))
    return "; ".join(parts) or None


def _size(file: Path) -> Optional[int]:
    try:
        return file.stat().st_size if file.is_file() else None
    except OSError:
        return None


def _from_manifest(step_dir: Path, listed: dict) -> Optional[str]:
    missing, wrong = [], []
    for name in REQUIRED_FILES:
        if name not in listed and not (step_dir / name).is_file():
            missing.append(name)
    for name, expected in listed.items():
        if name.split("/")[0] in OPTIONAL_DIRS:
            continue
        size = _size(step_dir / name)
        if size is None:
            missing.append(name)
        elif size != expected and name not in TEXT_RECORDS:
            wrong.append((name, size, expected))
    return _describe(missing, wrong, at_least=False)


@lru_cache(maxsize=64)
def _index_extents(index: str, mtime_ns: int, size: int) -> Optional[dict[str, int]]:
    """{shard file: bytes it must hold at least} from a torch_dist ``.metadata`` (None if unreadable);
    keyed by the index's mtime and size, so each index is unpickled once."""
    try:
        with open(index, "rb") as fh:
            metadata = pickle.load(fh)  # imports torch.distributed.checkpoint's classes on the way
        extents: dict[str, int] = {}
        for info in metadata.storage_data.values():
            extents[info.relative_path] = max(extents.get(info.relative_path, 0), info.offset + info.length)
        return extents
    except Exception:  # a truncated or foreign pickle raises anything from EOFError to AttributeError
        return None


def _without_manifest(step_dir: Path) -> Optional[str]:
    missing = [name for name in (*REQUIRED_FILES, TORCH_DIST_INDEX, TORCH_DIST_COMMON)
               if not (step_dir / name).is_file()]
    wrong = []
    if TORCH_DIST_INDEX not in missing:
        stat = (step_dir / TORCH_DIST_INDEX).stat()
        extents = _index_extents(str(step_dir / TORCH_DIST_INDEX), stat.st_mtime_ns, stat.st_size)
        if extents is None:
            return f"{TORCH_DIST_INDEX} unreadable" + (f"; {_listed(missing, 'missing')}" if missing else "")
        for name, end in sorted(extents.items()):
            size = _size(step_dir / name)
            if size is None:
                missing.append(name)
            elif size < end:
                wrong.append((name, size, end))
    return _describe(missing, wrong, at_least=True)


def incomplete_reason(step_dir: Path) -> Optional[str]:
    """What ``step_dir`` lacks to be a complete checkpoint ("__0_1.distcp missing", "x truncated (1 of 9
    bytes)"), or None when it is complete (see the design note above)."""
    step_dir = Path(step_dir)
    if not step_dir.is_dir():
        return _listed(list(REQUIRED_FILES), "missing")
    manifest = step_dir / MANIFEST_FILE
    if not manifest.is_file():
        return _without_manifest(step_dir)
    try:
        listed = json.loads(manifest.read_text())["files"]
        if not isinstance(listed, dict) or not all(isinstance(v, int) for v in listed.values()):
            raise ValueError
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return f"{MANIFEST_FILE} unreadable"
    return _from_manifest(step_dir, listed)


def is_complete(step_dir: Path) -> bool:
    return incomplete_reason(step_dir) is None


def _step_dirs(ckpt_root: Path) -> list[Path]:
    """Every ``step_N`` directory under ``ckpt_root``, complete or not, oldest first."""
    if not ckpt_root.is_dir():
        return []
    found = []
    for child in ckpt_root.iterdir():
        match = _STEP_RE.match(child.name)
        if match and child.is_dir():
            found.append((int(match.group(1)), child))
    return [path for _, path in sorted(found)]


def complete_steps(ckpt_root: Path) -> list[Path]:
    """Complete ``step_N`` directories under ``ckpt_root``, oldest first."""
    return [path for path in _step_dirs(ckpt_root) if is_complete(path)]


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
        is_step = bool(name) and "/" not in name and target.is_dir()
        reason = incomplete_reason(target) if is_step else None
        if is_step and reason is None:
            return Resolved(target)
        problem = (f"{latest} names '{name}', which is incomplete ({reason})" if reason
                   else f"{latest} names '{name}', which is not a complete checkpoint")
    steps = _step_dirs(ckpt_root)
    complete = [step for step in steps if is_complete(step)]
    if complete:
        newest = complete[-1]
        why = problem or f"{ckpt_root} has no {LATEST} file"
        if problem is None and steps[-1] != newest:  # say why the newest step directory was passed over
            why += f", and {steps[-1].name} is incomplete ({incomplete_reason(steps[-1])})"
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
    if any((path / name).is_file() for name in (MANIFEST_FILE, STATE_FILE, TORCH_DIST_MARKER, TORCH_DIST_INDEX)):
        reason = incomplete_reason(path)
        if reason:
            raise UserError(f"checkpoint {path} is incomplete ({reason}); pass another checkpoint or the run "
                            "directory (which uses its newest complete checkpoint)")
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


DAMAGED_DIR = "checkpoints.damaged"
"""Where a resume moves a checkpoint whose shards could not be read or failed their digests (kept for
inspection, never resumed from, never deleted)."""


def set_aside_damaged(step_dir: Path) -> Optional[Path]:
    """Move a complete-looking but damaged ``step_N`` of a run to RUN_DIR/checkpoints.damaged/ (as
    ``step_N.2``, ``.3``, ... when an earlier damaged copy of that step is there: nothing is deleted) and
    point ``latest`` at the newest complete step left; returns that step, or None (and moves nothing)
    when no other complete step is left to resume from."""
    root = step_dir.parent
    others = [p for p in complete_steps(root) if p != step_dir]
    if not others:
        return None
    aside = root.parent / DAMAGED_DIR
    aside.mkdir(exist_ok=True)
    target, copy = aside / step_dir.name, 1
    while target.exists():
        copy += 1
        target = aside / f"{step_dir.name}.{copy}"
    step_dir.rename(target)
    write_latest(root, others[-1].name)
    return others[-1]


def publish_step(tmp: Path, final: Path) -> None:
    """Give a fully written checkpoint its name, then point ``latest`` at it, in that order: ``latest``
    never names a directory that is not complete under its final name (a crash between the two leaves
    the new step complete and ``latest`` at the previous one, which the next run passes over with a
    note). A step saved again (a signal right after a periodic save, a rollback) replaces the old one."""
    import shutil

    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    write_latest(final.parent, final.name)


def write_latest(ckpt_root: Path, name: str) -> None:
    """Replace ``latest`` atomically (a temp file renamed over it)."""
    tmp = ckpt_root / (LATEST + ".tmp")
    tmp.write_text(name + "\n")
    os.replace(tmp, ckpt_root / LATEST)
