"""Why a write failed, in words a user can act on (for output.py and the trainer's saves), and the
one ``UserError`` sentence a command's failed write becomes (``write_failures``, ``write_error``).

Commands' outputs (output.py) and training saves (training/checkpoint_saver.py) share it.
megatron-core and torch report a failed write in many shapes: an OSError with an errno, torch's
zip writer's "unexpected pos" when a write came up short, a CheckpointException that carries each
rank's exception, often chained several levels deep. We walk all of them for the cause a user can
act on, and fall back to the disk's free space (a full disk is by far the most common cause).
A file-size limit (EFBIG: ``ulimit -f`` / RLIMIT_FSIZE, or the filesystem's largest file) reaches
us as an OSError only from Python's own writes; torch's writers report it as a short write
("unexpected pos") like a full disk, or, on the ranks that are not the coordinator, as a
CheckpointException that carries no cause at all. So a short write or a cause-less failure is
called a file-size limit when this process has a finite RLIMIT_FSIZE, naming a file that reached
it when one is left under the output.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path
from typing import Callable, Iterator, Optional, Sequence, Union

from megatron_mtp.errors import UserError

GIB = 1 << 30
PathLike = Union[str, "os.PathLike[str]"]


def size_text(nbytes: int) -> str:
    """'12.3 MiB' below a GiB, '4.56 GiB' from there."""
    return f"{nbytes / (1 << 20):.1f} MiB" if nbytes < GIB else f"{nbytes / GIB:.2f} GiB"


CAUSES = {
    errno.ENOSPC: "the filesystem is full",
    errno.EDQUOT: "the disk quota is exhausted",
    errno.EROFS: "the filesystem is read-only",
    errno.EACCES: "permission was denied",
    errno.EPERM: "permission was denied",
    errno.EIO: "an I/O error occurred",
    errno.EFBIG: "a file-size limit (ulimit -f / RLIMIT_FSIZE or the filesystem's maximum file size) stopped the write",
}
ADVICE = {
    errno.ENOSPC: "free space there or choose another place for it",
    errno.EDQUOT: "free space there or choose another place for it",
    errno.EROFS: "choose a place on a writable filesystem",
    errno.EACCES: "choose a directory you may write to, or fix its permissions",
    errno.EPERM: "choose a directory you may write to, or fix its permissions",
    errno.EFBIG: "raise the limit (ulimit -f unlimited) or write to a filesystem that allows larger files",
}
_FULL = (errno.ENOSPC, errno.EDQUOT)


def chain(exc: BaseException) -> Iterator[BaseException]:
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
    for item in chain(exc):
        if isinstance(item, OSError) and item.errno in CAUSES:
            return item.errno
    text = " ".join(str(item) for item in chain(exc)).lower()
    if "no space left" in text or "unexpected pos" in text:
        return errno.ENOSPC
    if "read-only file system" in text:
        return errno.EROFS
    return None


def others_failed(exc: BaseException) -> bool:
    """Whether `exc` is torch.distributed.checkpoint's report, on a rank that is not the coordinator,
    that the write failed somewhere: a CheckpointException carrying no failure (the coordinator's
    carries them all)."""
    return type(exc).__name__ == "CheckpointException" and not getattr(exc, "failures", None) \
        and exc.__cause__ is None


def file_size_limit() -> Optional[int]:
    """This process's RLIMIT_FSIZE in bytes (soft limit), or None when it has none."""
    import resource

    soft = resource.getrlimit(resource.RLIMIT_FSIZE)[0]
    return None if soft == resource.RLIM_INFINITY else soft


def limit_reached(exc: BaseException, places: Sequence[Path]) -> Optional[list[str]]:
    """The files a file-size limit stopped (possibly none named), or None when the failure is not one:
    an OSError EFBIG in the chain, or, with a finite RLIMIT_FSIZE, a short write or a failure without
    any cause that names a file at the limit or leaves no other cause (the module's note)."""
    efbig = [item for item in chain(exc) if isinstance(item, OSError) and item.errno == errno.EFBIG]
    if efbig and efbig[0].filename:
        return [os.path.basename(os.fsdecode(efbig[0].filename))]
    limit = file_size_limit()
    if not efbig and (limit is None or any(isinstance(item, OSError) and item.errno in CAUSES
                                           for item in chain(exc))):
        return None
    at_limit = []
    for place in places if limit is not None else ():
        for folder, _, names in os.walk(place):
            for name in names:
                try:
                    if os.stat(os.path.join(folder, name)).st_size >= limit:
                        at_limit.append(os.path.relpath(os.path.join(folder, name), place))
                except OSError:
                    continue
    text = " ".join(str(item) for item in chain(exc)).lower()
    if efbig or at_limit or "unexpected pos" in text or "file too large" in text or others_failed(exc):
        return sorted(at_limit)
    return None


def limit_text(files: list[str]) -> str:
    limit = file_size_limit()
    what = ", ".join(files[:2]) + (f" and {len(files) - 2} more" if len(files) > 2 else "") if files else "a file"
    return (f"a file-size limit (ulimit -f / RLIMIT_FSIZE{f', {size_text(limit)} here,' if limit else ''} or the "
            f"filesystem's maximum file size) stopped the write of {what}")


def free_bytes(path: Path) -> Optional[int]:
    for probe in (path, *path.parents):
        if probe.exists():
            return shutil.disk_usage(probe).free
    return None


def cause_text(code: int, where: Path, needed_bytes: Optional[int], at_least: bool) -> str:
    cause = CAUSES[code]
    if code in _FULL:
        free = free_bytes(where)
        need = f"needs {'more than' if at_least else 'about'} {size_text(needed_bytes)}, " if needed_bytes else ""
        have = f"{size_text(free)} free" if free is not None else "free space unknown"
        cause += f" ({need}{have})"
    return cause


def describe_failure(exc: BaseException, where: Path, needed_bytes: Optional[int],
                     at_least: bool = False, written: Optional[Path] = None) -> Optional[str]:
    """'<cause> (needs about X GiB, Y GiB free)' for a failed write under `where`; None when the
    exception is not a write failure (a bug, to be raised as it is). `at_least`: needed_bytes is
    only what was written before the failure; `written`: the directory the write went to (where a
    file that reached a file-size limit is looked for)."""
    stopped = limit_reached(exc, [written] if written is not None else [])
    if stopped is not None:
        return limit_text(stopped) + f"; {ADVICE[errno.EFBIG]}"
    code = failure_errno(exc)
    free = free_bytes(where)
    if code is None and free is not None and needed_bytes and free < needed_bytes:
        code = errno.ENOSPC
    if code is None:
        if any(isinstance(item, OSError) for item in chain(exc)):
            first = next(item for item in chain(exc) if isinstance(item, OSError))
            return f"{type(first).__name__}: {first}"
        return None
    return cause_text(code, where, needed_bytes, at_least)


# --- a command's failed write, as one sentence ----------------------------------------------------


def _concerns(filename: object, out: Path, written: Sequence[Path]) -> bool:
    """Whether an OSError's file is the output: OUT, its temporary, a written path (or under one), or a
    directory above OUT."""
    if filename is None:
        return True
    path = os.path.abspath(os.fsdecode(filename))  # type: ignore[arg-type]
    mine = (str(out), str(out.parent / f".{out.name}.tmp-"), *map(str, written))
    return path.startswith(mine) or Path(path) in out.parents


def _output_errno(exc: BaseException, out: Path, written: Sequence[Path]) -> Optional[int]:
    """The errno of a failure to write the output; None for anything else (a bad input, a bug, a
    source file that cannot be read), which is raised as it is."""
    if isinstance(exc, UserError) or not isinstance(exc, Exception):
        return None
    for item in chain(exc):
        if isinstance(item, OSError) and item.errno is not None:
            if item.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
                return item.errno
            if _concerns(item.filename, out, written) and (item.errno in CAUSES or item.filename is not None):
                return item.errno
            return None
    return failure_errno(exc)  # torch's writers: "unexpected pos", "No space left" in the text only


def write_error(exc: BaseException, out: Path, what: str = "output", written: Sequence[Path] = (),
                needed_bytes: Optional[int] = None, at_least: bool = False) -> Optional[UserError]:
    """The one-sentence UserError for a failure to write ``out``; None when ``exc`` is something else."""
    code = _output_errno(exc, out, written)
    if code is None:
        return None
    stopped = limit_reached(exc, [w for w in written if w.is_dir()])
    if stopped is not None:
        return UserError(f"cannot write {what} '{out}': {limit_text(stopped)}; {ADVICE[errno.EFBIG]}")
    if code in CAUSES:
        cause = cause_text(code, out.parent, needed_bytes, at_least)
    else:
        cause = (os.strerror(code) or f"error {code}").lower()
    advice = ADVICE.get(code, "check the disk and try again")
    return UserError(f"cannot write {what} '{out}': {cause}; {advice}")


@contextlib.contextmanager
def write_failures(out: PathLike, what: str = "output", written: Sequence[PathLike] = (),
                   needed_bytes: Union[int, Callable[[], Optional[int]], None] = None) -> Iterator[None]:
    """Turn a failed write of ``out`` inside the block into its one-sentence UserError. ``written``:
    the temporary paths (and prefixes) the block writes; ``needed_bytes``: the output's size, or a
    function giving what was written so far when the size is not known up front."""
    out = Path(out).absolute()
    try:
        yield
    except BaseException as exc:
        nbytes = needed_bytes() if callable(needed_bytes) else needed_bytes
        error = write_error(exc, out, what, [Path(w).absolute() for w in written], nbytes,
                            at_least=callable(needed_bytes))
        if error is None:
            raise
        raise error from exc
