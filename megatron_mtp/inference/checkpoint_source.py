"""Accept a megatron-mtp checkpoint or run directory where an HF export is expected.

A run directory, its checkpoints/ directory, a step directory or the ``latest`` file (the rules of
``checkpoint.run_dir``, shared with eval and convert) is exported once with ``megatron_mtp.convert.to_hf.export_to_hf``
(``mtp="separate"``, fp32) into a cache folder keyed by the checkpoint's absolute path and the
mtime of its train_state.json; the export goes to a temporary name and is renamed when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from megatron_mtp.checkpoint.run_dir import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    STATE_FILE,
    find_checkpoint,
    resolve_checkpoint,
)
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.data.default_corpus import default_cache_dir
from megatron_mtp.errors import UserError
from megatron_mtp.inference.family import SUPPORTED


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


def hf_dir_for(path: Path) -> Path:
    """``path`` itself for HF exports; a cached HF export for megatron-mtp checkpoints."""
    if not path.exists():
        raise UserError(
            f"model directory {path} does not exist; pass an exported Hugging Face directory of {SUPPORTED}."
        )
    ckpt = checkpoint_dir_of(path)
    if ckpt is None:
        return path
    stamp = (ckpt / STATE_FILE).stat().st_mtime_ns
    key = hashlib.sha1(f"{ckpt.resolve()}:{stamp}".encode()).hexdigest()[:16]
    out = Path(default_cache_dir()) / "hf_exports" / key
    if (out / "main" / "config.json").is_file():
        return out
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.parent.mkdir(parents=True, exist_ok=True)
    print(f"exporting {ckpt} to Hugging Face format in {out}", file=sys.stderr)
    try:
        export_to_hf(str(ckpt), str(tmp), mtp="separate", dtype="fp32")
        if out.exists():  # another process finished first
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out
