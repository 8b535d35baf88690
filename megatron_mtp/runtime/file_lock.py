"""The one exclusive file lock (``flock``) of the project, for writers and builders that take turns.

Design note. ``flock`` locks belong to an open file and go with its process, so a killed holder never
leaves a lock behind. Three uses: take turns while publishing into a directory or building a cache
entry (``exclusive_lock``, blocking); mark a temporary as owned by a live writer (``try_hold``); tell
whether such a mark is held (``held_by_another``). Where a filesystem has no locks (some network
filesystems), ``best_effort`` callers go on without one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Iterator, Union

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def exclusive_lock(path: PathLike, best_effort: bool = False) -> Iterator[None]:
    """Hold an exclusive lock on ``path`` while the block runs, waiting for any other holder first.

    A directory is locked itself; any other path is a lock file, created when missing. ``best_effort``:
    when the path cannot be opened or locked, the block runs without a lock instead of failing."""
    flags = os.O_RDONLY if os.path.isdir(path) else os.O_RDWR | os.O_CREAT
    try:
        fd = os.open(path, flags, 0o644)
    except OSError:
        if not best_effort:
            raise
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            if not best_effort:
                raise
        yield
    finally:
        os.close(fd)  # drops the lock


def try_hold(fd: int) -> bool:
    """Take an exclusive lock on open file ``fd`` without waiting; False when another holds it or the
    filesystem has no locks."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except (OSError, ValueError):
        return False
    return True


def held_by_another(path: PathLike) -> bool:
    """Whether some process holds the lock of ``path`` (a missing file: no; a file that cannot be
    opened: assumed held)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    except OSError:
        return True
    try:
        return not try_hold(fd)
    finally:
        os.close(fd)
