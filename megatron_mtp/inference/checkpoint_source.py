"""Accept a megatron-mtp checkpoint or run directory where an HF export is expected.

A run directory, its checkpoints/ directory, a step directory or the ``latest`` file (the rules of
``checkpoint.run_dir``, shared with eval and convert) is exported once by ``megatron-mtp convert to-hf
--mtp separate --dtype fp32`` into a cache folder keyed by the checkpoint's absolute path and the
mtime of its train_state.json. The export runs in a process of its own (``export_checkpoint``): the
decoder reads Hugging Face directories only and imports nothing of convert/; the export's progress
lines pass through to stderr, and its error sentence becomes the decoder's.

Design note. A trainer may be saving into the run while it is decoded (``checkpoint.keep_last``
deletes the step being read), so:
  - an entry is published whole or not at all: the export goes to a temporary name, is checked
    (config and, when the checkpoint has one, the tokenizer), gets its ``.complete`` mark and is then
    renamed into place; a folder without the mark is rebuilt, never used;
  - an export whose step vanished or changed while it was read is thrown away and, for a run
    directory, made again from the newest complete step (a step named directly is one sentence);
  - the cache keeps the CACHE_ENTRIES most recently used exports (each use refreshes its mark) and
    removes the rest after each new one; deleting the folder clears it.
"""

from __future__ import annotations

import collections
import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from megatron_mtp.checkpoint.run_dir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    STATE_FILE,
    TOKENIZER_DIR,
    find_checkpoint,
    is_complete,
    resolve_checkpoint,
)
from megatron_mtp.data.default_corpus import default_cache_dir
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import supported_text
from megatron_mtp.output import stale_temp_writer, temp_name


def checkpoint_dir_of(path: Path) -> Path | None:
    """The checkpoint ``path`` designates (checkpoint.run_dir's rules), or None for an HF export."""
    if (path / "config.json").is_file() or (path / "main" / "config.json").is_file():
        return None
    found = find_checkpoint(path)
    if found is None:
        if (path / CHECKPOINTS_DIR).is_dir() or (path / CONFIG_FILE).is_file():  # a run directory: say what eval
            resolve_checkpoint(path, what="model")  # and convert say (it holds no checkpoint), not config.json
        return None
    if found.note:
        print(f"note: {found.note}", file=sys.stderr)
    return found.path


CACHE_ENTRIES = 3
"""Exports the decoder's cache keeps (the most recently used); an fp32 export is 4 bytes per parameter."""
MARK = ".complete"
ATTEMPTS = 5


def cache_root() -> Path:
    return Path(default_cache_dir()) / "hf_exports"


def export_checkpoint(ckpt: Path, out: Path) -> None:
    """Export ``ckpt`` into ``out`` (MTP separate, fp32) with ``megatron-mtp convert to-hf`` in a child
    process (module note); a refusal there is its one sentence here."""
    cmd = [sys.executable, "-m", "megatron_mtp", "convert", "to-hf", str(ckpt), str(out), "--mtp", "separate",
           "--dtype", "fp32"]
    tail: collections.deque = collections.deque(maxlen=40)
    wrote = False
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as proc:
        for line in proc.stdout:  # stdout stays the decoder's (its tokens, its JSON)
            wrote = wrote or line.startswith("wrote ")
            # its progress and notes; not the SERVING.md (nor the note on it) of a folder about to be renamed
            if not wrote and not line.startswith("note: SERVING.md"):
                sys.stderr.write(line)
            tail.append(line)
    if not proc.returncode:
        print(f"note: exported {ckpt} to the Hugging Face format for decoding (kept in the export cache "
              f"{cache_root()})", file=sys.stderr)
    if proc.returncode:
        said = [line.split(": error: ", 1)[1].strip() for line in tail if ": error: " in line]
        if said:
            raise UserError(said[-1])
        raise RuntimeError(f"exporting {ckpt} for decoding failed (exit {proc.returncode}):\n{''.join(tail)}")


class _SourceChanged(Exception):
    """The step being exported went away or was replaced while it was read."""


def _stamp(ckpt: Path) -> int:
    try:
        return (ckpt / STATE_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        raise _SourceChanged from None


def _export(ckpt: Path) -> Path:
    stamp = _stamp(ckpt)
    key = hashlib.sha1(f"{ckpt.resolve()}:{stamp}".encode()).hexdigest()[:16]
    out = cache_root() / key
    if (out / MARK).is_file():
        (out / MARK).touch()  # most recently used
        return out
    if out.exists():  # an entry left incomplete (or by an older version): rebuilt
        shutil.rmtree(out, ignore_errors=True)
    tmp = temp_name(out)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"exporting {ckpt} to Hugging Face format in {out} (a cache of the {CACHE_ENTRIES} most recently "
          f"decoded checkpoints; delete {cache_root()} to clear it)", file=sys.stderr)
    try:
        try:
            export_checkpoint(ckpt, tmp)
        except Exception:
            if _stamp(ckpt) != stamp or not is_complete(ckpt):
                raise _SourceChanged from None
            raise
        if _stamp(ckpt) != stamp or not is_complete(ckpt):
            raise _SourceChanged
        if (ckpt / TOKENIZER_DIR).is_dir() and not (tmp / "main" / "tokenizer.json").is_file():
            raise _SourceChanged  # the tokenizer went with a step deleted mid-copy
        (tmp / MARK).write_text(f"{ckpt}\n")
        if (out / MARK).is_file():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            shutil.rmtree(out, ignore_errors=True)
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _evict(keep=out)
    return out


def _evict(keep: Path) -> None:
    """Remove all but the CACHE_ENTRIES most recently used complete exports (and leftovers of dead writers)."""
    entries = []
    for entry in cache_root().iterdir():
        if entry == keep or not entry.is_dir():
            continue
        if entry.name.startswith("."):  # a temporary (output.temp_name): removed once its writer is gone
            if stale_temp_writer(entry) is not None:
                shutil.rmtree(entry, ignore_errors=True)
            continue
        mark = entry / MARK
        entries.append((mark.stat().st_mtime_ns if mark.is_file() else 0, entry))
    for _, entry in sorted(entries, reverse=True)[CACHE_ENTRIES - 1:]:
        shutil.rmtree(entry, ignore_errors=True)


def hf_dir_for(path: Path) -> Path:
    """``path`` itself for HF exports; a cached HF export for megatron-mtp checkpoints."""
    if not path.exists():
        raise UserError(
            f"model directory {path} does not exist; pass an exported Hugging Face directory of "
            f"{supported_text(decoding=True)}."
        )
    for _ in range(ATTEMPTS):
        ckpt = checkpoint_dir_of(path)
        if ckpt is None:
            return path
        try:
            return _export(ckpt)
        except _SourceChanged:
            if ckpt.resolve() == path.resolve():
                raise UserError(f"checkpoint {ckpt} was removed or replaced while it was read (a trainer's "
                                "checkpoint.keep_last removes old steps); pass the run directory to decode its "
                                "newest complete checkpoint") from None
            print(f"note: {ckpt} was removed while it was read; taking the newest complete checkpoint again",
                  file=sys.stderr)
    raise UserError(f"every checkpoint of {path} was removed while it was read ({ATTEMPTS} tries); decode it when "
                    "the trainer saves less often, or copy a step elsewhere first")
