"""Why a checkpoint write failed, in one sentence.

megatron-core and torch report a failed write in many shapes: an OSError with an errno, torch's
zip writer's "unexpected pos" when a write came up short, a CheckpointException that carries each
rank's exception, often chained several levels deep. We walk all of them for the cause a user can
act on, and fall back to the disk's free space (a full disk is by far the most common cause).
"""

from __future__ import annotations

import errno
import shutil
from pathlib import Path
from typing import Iterator, Optional

GIB = 1 << 30


def size_text(nbytes: int) -> str:
    """'12.3 MiB' below a GiB, '4.56 GiB' from there."""
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes < GIB else f"{nbytes / GIB:.2f} GiB"
_CAUSES = {
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission was denied",
    errno.EPERM: "permission was denied",
    errno.EIO: "an I/O error occurred",
}


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen, todo = set(), [exc]
    while todo:
        item = todo.pop()
        if not isinstance(item, BaseException) or id(item) in seen:
            continue
        seen.add(id(item))
        yield item
        todo += [item.__cause__, item.__context__, getattr(item, "exc", None)]
        failures = getattr(item, "failures", None)  # torch.distributed.checkpoint's CheckpointException:
        if isinstance(failures, dict):               # rank -> (exception, traceback summary)
            todo += [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def failure_errno(exc: BaseException) -> Optional[int]:
    """The errno of the first OSError in the exception's chain (None if there is none)."""
    for item in _chain(exc):
        if isinstance(item, OSError) and item.errno in _CAUSES:
            return item.errno
    text = " ".join(str(item) for item in _chain(exc)).lower()
    if "no space left" in text or "unexpected pos" in text:
        return errno.ENOSPC
    if "read-only file system" in text:
        return errno.EROFS
    return None


def free_bytes(path: Path) -> Optional[int]:
    for probe in (path, *path.parents):
        if probe.exists():
            return shutil.disk_usage(probe).free
    return None


def describe_failure(exc: BaseException, where: Path, needed_bytes: Optional[int],
                     at_least: bool = False) -> Optional[str]:
    """'<cause> (needs about X GiB, Y GiB free)' for a failed write under `where`; None when the
    exception is not a write failure (a bug, to be raised as it is). `at_least`: needed_bytes is
    only what was written before the failure."""
    code = failure_errno(exc)
    free = free_bytes(where)
    if code is None and free is not None and needed_bytes and free < needed_bytes:
        code = errno.ENOSPC
    if code is None:
        if any(isinstance(item, OSError) for item in _chain(exc)):
            first = next(item for item in _chain(exc) if isinstance(item, OSError))
            return f"{type(first).__name__}: {first}"
        return None
    cause = _CAUSES[code]
    if code in (errno.ENOSPC, errno.EDQUOT):
        need = f"needs {'more than' if at_least else 'about'} {size_text(needed_bytes)}, " if needed_bytes else ""
        have = f"{size_text(free)} free" if free is not None else "free space unknown"
        cause += f" ({need}{have})"
    return cause
