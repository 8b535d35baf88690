"""A failed checkpoint write is described by its cause, however deep megatron-core and torch wrap it."""

from __future__ import annotations

import errno
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from megatron_mtp.output import describe_failure


def _wrapped(exc: Exception) -> CheckpointException:
    try:
        raise exc
    except Exception as caught:
        return CheckpointException("write failed", {0: _wrap_exception(caught)})


def test_causes_are_found_through_every_wrapper(tmp_path: Path):
    full = OSError(errno.ENOSPC, "No space left on device")
    assert describe_failure(full, tmp_path, 3 << 30).startswith("the filesystem is full (needs about 3.00 GiB, ")
    torch_writer = RuntimeError("Worker failure: [enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598")
    assert describe_failure(_wrapped(torch_writer), tmp_path, 1 << 30, at_least=True).startswith(
        "the filesystem is full (needs more than 1.00 GiB, ")
    chained = RuntimeError("save failed")
    chained.__cause__ = OSError(errno.EROFS, "Read-only file system")
    assert describe_failure(_wrapped(chained), tmp_path, None) == "the filesystem is read-only"


def test_a_bug_is_not_called_a_write_failure(tmp_path: Path):
    assert describe_failure(_wrapped(KeyError("model.layers.3")), tmp_path, None) is None
    assert describe_failure(ImportError("no module"), tmp_path, None) is None
