"""Accept a Hugging Face export where a megatron-mtp checkpoint is expected (``megatron-mtp eval``).

An HF directory (bf16, fp32 or DeepSeek's FP8 release format, main only, inline or ``main/`` +
``mtp/``) is imported once with ``convert.from_hf.import_from_hf`` (fp32: FP8 blocks dequantised
exactly) into a cache folder keyed by its absolute path and the size and mtime of every file in it,
so an edited or replaced export is imported again; the import is staged beside its folder and renamed
when complete (megatron_mtp/output.py). Anything else is returned unchanged for checkpoint.run_dir's rules.
"""

from __future__ import annotations

import hashlib
import os
import sys
from pathlib import Path

from megatron_mtp.data.default_corpus import default_cache_dir
from megatron_mtp.errors import UserError

CACHE_FOLDER = "hf_imports"


def is_hf_export(path: Path) -> bool:
    return (path / "config.json").is_file() or (path / "main" / "config.json").is_file()


def _stamp(path: Path) -> str:
    parts = [str(path.resolve())]
    for f in sorted(p for p in path.rglob("*") if p.is_file()):
        st = f.stat()
        parts.append(f"{f.relative_to(path)}:{st.st_size}:{st.st_mtime_ns}")
    return hashlib.sha1("\n".join(parts).encode()).hexdigest()[:16]


def checkpoint_of(path: str | os.PathLike) -> str:
    """A checkpoint path for ``path``: its cached import when it is an HF export, else ``path`` itself."""
    src = Path(path)
    if not src.is_dir() or not is_hf_export(src):
        return str(path)
    from megatron_mtp.convert.from_hf import import_from_hf

    out = Path(default_cache_dir()) / CACHE_FOLDER / _stamp(src)
    if (out / "config.yaml").is_file():
        return str(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"importing Hugging Face model {src} into {out}", file=sys.stderr)
    try:
        import_from_hf(src, out)  # staged beside out and renamed when complete
    except UserError:
        if not (out / "config.yaml").is_file():  # not merely another process finishing first
            raise
    return str(out)
