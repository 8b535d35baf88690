"""A failed checkpoint write is described by its cause, however deep megatron-core and torch wrap it."""

from __future__ import annotations

import errno
from pathlib import Path

from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception

from megatron_mtp.write_causes import describe_failure


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


def test_a_pruned_file_vanishing_during_the_free_space_check_is_not_an_error(tmp_path: Path, monkeypatch):
    """The background removal of a pruned step races the next save's free-space check on rank 0: a file
    listed, then removed before its size is read, counts as gone (the check raised outside any handler
    while the other ranks waited at the agreement)."""
    import os
    import stat

    from megatron_mtp.checkpoint import run_dir
    from megatron_mtp.training import checkpoint_saver

    root = tmp_path / "checkpoints"
    step = root / run_dir.step_dir_name(2)
    step.mkdir(parents=True)
    for name in run_dir.REQUIRED_FILES:
        (step / name).write_text("x")
    (step / "__0_0.distcp").write_bytes(b"s" * 1000)
    run_dir.write_manifest(step)
    pruned = root / ("step_0000001" + checkpoint_saver.DELETING)
    pruned.mkdir()
    for i in range(3):
        (pruned / f"__0_{i}.distcp").write_bytes(b"s" * 1000)
    real_stat, removed = os.stat, []

    def racing_stat(path, *args, **kwargs):  # the background thread removes each pruned file right after it is listed
        result = real_stat(path, *args, **kwargs)
        if str(path).startswith(str(pruned)) and stat.S_ISREG(result.st_mode):
            os.remove(path)
            removed.append(path)
        return result

    monkeypatch.setattr(os, "stat", racing_stat)
    saver = object.__new__(checkpoint_saver.CheckpointSaver)
    saver.root = root
    assert saver._check_room(3) is None  # plenty of room, and no FileNotFoundError
    assert removed and not list(pruned.iterdir())
    monkeypatch.setattr(os, "stat", real_stat)
    assert checkpoint_saver._dir_bytes(root / "nowhere") == 0  # a directory removed whole counts as empty


_LIMITED = r"""
import errno, json, resource, signal, sys
from pathlib import Path
import torch
from megatron_mtp.write_causes import describe_failure, write_failures
from torch.distributed.checkpoint.api import CheckpointException
out = Path(sys.argv[1])
if sys.argv[2] == "limit":
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the default action kills the process; ignored, write() fails
    resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 16, 1 << 16))
found = {}
try:
    (out / "big.bin").write_bytes(b"x" * (1 << 17))
except OSError as exc:
    found["python"] = [exc.errno == errno.EFBIG, describe_failure(exc, out, None, written=out)]
try:
    torch.save(torch.zeros(1 << 16), out / "shard.pt")  # torch's zip writer: a short write, "unexpected pos"
except RuntimeError as exc:
    found["torch"] = describe_failure(exc, out, None, written=out)
    found["other_rank"] = describe_failure(CheckpointException("write", {}), out, None, written=out)
staged = out / "staged"
staged.mkdir()
try:
    with write_failures(out / "model", "the model", written=[staged]):
        torch.save(torch.zeros(1 << 16), staged / "weights.pt")
except Exception as exc:
    found["command"] = str(exc)
print(json.dumps(found))
"""


def test_a_file_size_limit_is_named_as_such_on_every_path(tmp_path: Path):
    """EFBIG (ulimit -f), caused for real in a process with RLIMIT_FSIZE: Python's write, torch's short
    write on the coordinator and the cause-less report the other ranks get are one sentence naming the
    limit and the file, never "the filesystem is full" or a traceback; without the limit torch's short
    write stays a full disk."""
    import json
    import subprocess
    import sys

    def run(mode: str) -> dict:
        out = tmp_path / mode
        out.mkdir()
        done = subprocess.run([sys.executable, "-c", _LIMITED, str(out), mode], capture_output=True, text=True,
                              timeout=300, cwd=Path(__file__).resolve().parents[2])
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(done.stdout.strip().splitlines()[-1])

    limited = run("limit")
    is_efbig, python = limited["python"]
    assert is_efbig and python.startswith("a file-size limit (ulimit -f / RLIMIT_FSIZE, 0.1 MiB here, or the "
                                          "filesystem's maximum file size) stopped the write of big.bin; raise"), python
    assert "stopped the write of big.bin, shard.pt; raise the limit (ulimit -f unlimited)" in limited["torch"]
    assert "stopped the write of big.bin, shard.pt" in limited["other_rank"]
    assert limited["command"].startswith(f"cannot write the model '{tmp_path / 'limit' / 'model'}': a file-size "
                                         "limit (ulimit -f / RLIMIT_FSIZE"), limited["command"]
    assert "stopped the write of weights.pt; raise" in limited["command"]
    assert "full" not in " ".join(map(str, limited.values()))
    assert "other_rank" in limited and run("free") == {}  # without the limit every write succeeds
