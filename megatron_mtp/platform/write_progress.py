"""How far this rank's checkpoint writer has got: the files it plans to write, and their size on disk.

Design note. megatron-core's torch_dist writer (FileSystemWriterAsync) plans, in the rank's own
process, which files it will write and what goes into each (`prepare_write_data`); the writing
itself then runs in forked processes or threads, for a synchronous save and a background one
alike. Wrapping the planning step records each planned file and its bytes (tensors and pickled
objects) in `PLANNED`, so the trainer's watchdog can measure the writer from outside: the bytes
of those files on disk grow while it writes. A file is complete once it holds at least its
planned bytes (torch.save adds a little framing to each item).

Fault injection, for the tests of the watchdog only (read in the writer, like step_guard's):
MEGATRON_MTP_INJECT_SLOW_WRITE="S" makes each rank's writer take about S seconds per save, its
items written and flushed at an even pace; MEGATRON_MTP_INJECT_STUCK_WRITE="N" (or "N:R": on rank R
alone) makes the writer of the save of step N stop before its first item, until the rank's process
is gone.
"""

from __future__ import annotations

import functools
import io
import os
import time
from pathlib import Path

TARGET = "megatron.core.dist_checkpointing.strategies.filesystem_async"
PLANNED: dict[str, int] = {}
"""Planned file path -> its planned bytes, for the saves of this process (cleared by `forget`)."""
_RANK_PID = os.getpid()
"""The rank's process (the writer may run in a process forked from it)."""


def _data_bytes(data) -> int:
    if isinstance(data, io.BytesIO):
        return len(data.getbuffer())
    return int(data.numel()) * int(data.element_size())


def _planned_bytes(bucket) -> int:
    _path, _key, (bytes_data, tensor_data) = bucket
    return sum(_data_bytes(data) for _, data in bytes_data) + sum(_data_bytes(t) for _, t in tensor_data)


def progress(directory: Path) -> tuple[int, int, bool]:
    """(bytes on disk, bytes planned, every file complete) of this rank's files in `directory`."""
    written = planned = 0
    complete = True
    prefix = str(directory) + os.sep
    for path, size in list(PLANNED.items()):
        if not path.startswith(prefix):
            continue
        try:
            on_disk = os.stat(path).st_size
        except OSError:
            on_disk = 0
        written, planned, complete = written + on_disk, planned + size, complete and on_disk >= size
    return written, planned, complete


def forget(directory: Path) -> None:
    prefix = str(directory) + os.sep
    for path in [p for p in PLANNED if p.startswith(prefix)]:
        PLANNED.pop(path, None)


def _injected_write_item(original):
    @functools.wraps(original)  # megatron-core reads its signature (serialization_format)
    def write_item(*args, **kwargs):
        slow = float(os.environ.get("MEGATRON_MTP_INJECT_SLOW_WRITE", "0") or 0)
        stuck = os.environ.get("MEGATRON_MTP_INJECT_STUCK_WRITE", "")
        if not slow and not stuck:
            return original(*args, **kwargs)
        at = next(i for i, a in enumerate(args) if hasattr(a, "fileno") and hasattr(a, "write"))
        stream, data = args[at], args[at + 1]
        step = int(Path(stream.name).parent.name.split("_")[1].split(".")[0])
        stuck_step, _, stuck_rank = stuck.partition(":")
        stopped = stuck and step == int(stuck_step) and stuck_rank in ("", os.environ.get("RANK", "0"))
        while stopped:  # no byte more until the rank is gone
            try:
                os.kill(_RANK_PID, 0)
            except ProcessLookupError:
                os._exit(1)
            time.sleep(0.2)
        result = original(*args, **kwargs)
        if slow:
            stream.flush()
            time.sleep(slow * _data_bytes(data) / max(1, PLANNED.get(stream.name, 1)))
        return result

    return write_item


def apply() -> None:
    import importlib

    global _RANK_PID
    _RANK_PID = os.getpid()
    module = importlib.import_module(TARGET)
    writer = module.FileSystemWriterAsync
    if getattr(writer, "_megatron_mtp_progress", False):
        return
    prepare = writer.prepare_write_data

    def prepare_write_data(self, plan, planner):
        prepare(self, plan, planner)
        for bucket in self.write_buckets or []:
            PLANNED[str(bucket[0])] = _planned_bytes(bucket)

    writer.prepare_write_data = prepare_write_data
    writer._megatron_mtp_progress = True
    module._write_item = _injected_write_item(module._write_item)  # a plain call unless a test injects
