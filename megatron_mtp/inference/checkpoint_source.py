"""Accept a megatron-mtp checkpoint or run directory where an HF export is expected.

A run dir (``RUN/checkpoints/latest``), a checkpoints dir (``latest``) or a checkpoint dir
(``train_state.json``) is exported once with ``megatron_mtp.convert.to_hf.export_to_hf``
(``mtp="separate"``, fp32) into a cache folder keyed by the checkpoint's absolute path and the
mtime of its train_state.json; the export goes to a temporary name and is renamed when complete.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path

from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError


def checkpoint_dir_of(path: Path) -> Path | None:
    """The checkpoint directory ``path`` designates, or None if it is not a megatron-mtp checkpoint."""
    for latest in (path / "checkpoints" / "latest", path / "latest"):
        if latest.is_file():
            name = latest.read_text().strip()
            ckpt = latest.parent / name
            if not name or not ckpt.is_dir():
                raise UserError(f"{latest} names {name!r}, which is not a checkpoint directory; the run may be corrupt.")
            return ckpt
    if (path / "train_state.json").is_file():
        return path
    return None


def _cache_root() -> Path:
    root = os.environ.get("MEGATRON_MTP_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "megatron_mtp"


def hf_dir_for(path: Path) -> Path:
    """``path`` itself for HF exports; a cached HF export for megatron-mtp checkpoints."""
    if not path.exists():
        raise UserError(f"model directory {path} does not exist; pass an exported Hugging Face DeepSeek-V3 directory.")
    ckpt = checkpoint_dir_of(path) if path.is_dir() else None
    if ckpt is None:
        return path
    stamp = (ckpt / "train_state.json").stat().st_mtime_ns if (ckpt / "train_state.json").exists() else 0
    key = hashlib.sha1(f"{ckpt.resolve()}:{stamp}".encode()).hexdigest()[:16]
    out = _cache_root() / "hf_exports" / key
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
