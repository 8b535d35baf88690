"""Output staging: everything is written under a hidden temporary sibling and renamed at the end.

A failed or interrupted conversion therefore never leaves a directory that looks complete: the
temporary one is removed on error, and the final name appears only by an atomic ``os.rename``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path
from typing import Iterator

from megatron_mtp.errors import UserError


def check_output_free(out: Path) -> None:
    if out.exists():
        raise UserError(f"output '{out}' already exists; remove it or choose a new directory")
    if not out.parent.exists():
        raise UserError(f"the parent directory of output '{out}' does not exist; create it first")


@contextlib.contextmanager
def staged_dir(out: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary directory that becomes ``out`` only if the block finishes without error."""
    out = Path(out).absolute()
    check_output_free(out)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    os.rename(tmp, out)
