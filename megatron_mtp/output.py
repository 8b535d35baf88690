"""Writing a command's output: staged, checked and published whole; every failure one sentence.

Every command that writes (``convert to-hf``, ``convert from-hf``, ``drop-mtp``, ``preprocess``,
``tokenizer train``) goes through here:

- refused before any work when OUT exists, its parent is missing, or nothing can be created in the
  parent (read-only filesystem, no permission: a probe directory is made and removed);
- staged under a hidden sibling unique to the process, ``.NAME.tmp-PID-RANDOM``;
- checked for free space before writing when its size is known (bytes needed vs free);
- a failed write (full disk, exhausted quota, file-size limit, read-only filesystem, no permission, I/O error) becomes
  one ``UserError`` sentence naming the output, the cause and what to do; the temporary goes on any
  failure, Ctrl-C included;
- published by one atomic rename; when OUT appeared meanwhile (another command writing the same
  output finished first), that output is kept, ours is removed, and the command says so.

The cause of a failed write and its sentence are found in write_causes.py, as for training saves.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
import socket
from pathlib import Path
from typing import Iterator, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.runtime.file_lock import exclusive_lock
from megatron_mtp.runtime.liveness import process_gone
from megatron_mtp.write_causes import PathLike, free_bytes, size_text, write_error, write_failures

# --- a command's output ---------------------------------------------------------------------------


def temp_name(out: Path) -> Path:
    """``.NAME.tmp-HOST-PID-RANDOM`` beside ``out``: no two writers share one, even across machines, and
    the next writer can tell whether the one that left it is gone (remove_stale_temps)."""
    return out.parent / f".{out.name}.tmp-{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"


def stale_temp_writer(path: Path) -> Optional[str]:
    """The pid of the writer that made temporary ``path`` (a ``temp_name``) when that writer is gone,
    else None (not a temporary, or its writer runs or is on another host)."""
    head, sep, tail = path.name.rpartition(".tmp-")
    if not sep or not head.startswith("."):
        return None
    parts = tail.rsplit("-", 2)  # HOST-PID-RANDOM (HOST may hold '-'), or PID-RANDOM of older versions
    host, pid = (parts[0], parts[1]) if len(parts) == 3 else (None, parts[0])
    return pid if pid.isdigit() and process_gone(host, int(pid)) else None


def remove_stale_temps(out: Path) -> list[str]:
    """Remove the temporaries of earlier writers of ``out`` that are gone (a ``kill -9``, a lost node:
    at 671B scale, hundreds of GB of partial shards) and say so on stderr; returns what was removed."""
    import sys

    removed = []
    prefix = f".{out.name}.tmp-"
    try:
        siblings = [p for p in out.parent.iterdir() if p.name.startswith(prefix)]
    except OSError:
        return removed
    for path in siblings:
        pid = stale_temp_writer(path)
        if pid is None:
            continue
        size = tree_bytes(path)
        _remove(path)
        removed.append(str(path))
        print(f"note: removed {path} ({size_text(size)}), left by an earlier writer of '{out}' (pid {pid}) that is "
              "gone", file=sys.stderr, flush=True)
    return removed


def tree_bytes(path: Path) -> int:
    """Bytes of the files under ``path`` (a file: its size; missing: 0)."""
    try:
        if not path.is_dir():
            return path.stat().st_size if path.exists() else 0
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    except OSError:
        return 0


def check_space(out: Path, needed_bytes: Optional[int], what: str = "output") -> None:
    """Refuse, before anything is written, an output larger than the free space beside it."""
    if not needed_bytes:
        return
    free = free_bytes(out.parent)
    if free is not None and free < needed_bytes:
        raise UserError(
            f"{what} '{out}' needs about {size_text(needed_bytes)} and '{out.parent}' has {size_text(free)} free; "
            "free space there or choose another place for it"
        )


def _empty_dir(path: Path) -> bool:
    try:
        return path.is_dir() and not any(path.iterdir())
    except OSError:
        return False


def check_output_free(out: Path, what: str = "output", may_exist_empty: bool = False,
                      make_parents: bool = False) -> None:
    """OUT must not exist (``may_exist_empty``: or be an empty directory), its parent must exist
    (``make_parents``: is created) and take a new directory."""
    out = Path(out).absolute()
    if out.exists() and not (may_exist_empty and _empty_dir(out)):
        raise UserError(f"{what} '{out}' already exists; remove it or choose a new directory")
    with write_failures(out, what):
        if make_parents:
            out.parent.mkdir(parents=True, exist_ok=True)
        if not out.parent.is_dir():
            raise UserError(f"the parent directory of {what} '{out}' does not exist; create it first")
        probe = temp_name(out)
        os.mkdir(probe)
        os.rmdir(probe)


def _taken(out: Path, what: str) -> UserError:
    return UserError(
        f"{what} '{out}' appeared while this command was writing it (another command writing the same output "
        "finished first); that one was kept and this command's copy removed"
    )


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


@contextlib.contextmanager
def staged_dir(out: PathLike, what: str = "output", needed_bytes: Optional[int] = None,
               may_exist_empty: bool = False, make_parents: bool = False) -> Iterator[Path]:
    """Yield a new temporary directory that becomes ``out`` only if the block finishes without error.

    ``needed_bytes``: the output's size when known (checked against the free space first).
    ``may_exist_empty``: an empty directory at ``out`` is replaced. Failures: see the module docstring."""
    out = Path(out).absolute()
    check_output_free(out, what, may_exist_empty, make_parents)
    remove_stale_temps(out)  # before the space check: what they hold is what this write may need
    tmp = temp_name(out)
    try:
        check_space(out, needed_bytes, what)
        os.mkdir(tmp)
        yield tmp
        if out.exists() and not (may_exist_empty and _empty_dir(out)):
            raise _taken(out, what)
        try:
            os.rename(tmp, out)  # onto an empty directory too, never onto a non-empty one
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.ENOTDIR, errno.EISDIR) and out.exists():
                raise _taken(out, what) from None
            raise
    except BaseException as exc:
        written = tree_bytes(tmp)
        _remove(tmp)
        error = write_error(exc, out, what, [tmp], needed_bytes or written or None, at_least=not needed_bytes)
        if error is None:
            raise
        raise error from exc


# --- outputs made of several files (PREFIX.bin/.idx) ------------------------------------------------


def file_identity(path: PathLike) -> Optional[tuple[int, int, int]]:
    """(device, inode, mtime) of a file, None when it does not exist: tells whether it was replaced."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def directory_lock(directory: PathLike) -> contextlib.AbstractContextManager[None]:
    """An exclusive lock on a directory while the block runs: writers publishing files into it take
    turns. Best effort: where the filesystem has no such locks (some network filesystems), none."""
    return exclusive_lock(directory, best_effort=True)


def check_not_replaced(path: PathLike, seen: Optional[tuple[int, int, int]], out: PathLike,
                       what: str = "output") -> None:
    """Raise the one sentence of a lost race when ``path`` exists and is not the file seen at the start
    (another command published the same output meanwhile)."""
    now = file_identity(path)
    if now is not None and now != seen:
        raise _taken(Path(out).absolute(), what)


def write_text_atomic(out: PathLike, text: str, what: str = "output") -> None:
    """Write ``out`` whole or not at all (a temporary beside it, then a rename); a failure is one sentence."""
    out = Path(out)
    tmp = temp_name(out)
    try:
        with write_failures(out, what, [tmp], len(text.encode())):
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
