"""`convert to-hf`, `convert from-hf` and `drop-mtp` into a read-only place, onto a full disk, or racing another
writer: exit 2, one sentence on stderr, no temporary and no half-written output; a finished output kept whole."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from megatron_mtp import output
from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter
from megatron_mtp.cli import main
from megatron_mtp.errors import is_one_sentence
from megatron_mtp.hf_dir.safetensors_io import ShardedSafetensorsWriter

# command -> (its arguments before OUT, the writer methods that put weights on disk, a step inside the
# staged write where another writer can finish first, the files a finished output holds)
COMMANDS = {
    "to-hf": (["convert", "to-hf"], [(ShardedSafetensorsWriter, "write"), (ShardedSafetensorsWriter, "copy_from")],
              "megatron_mtp.convert.to_hf.copy_tokenizer", ["SERVING.md", "config.json", "tokenizer.json"]),
    "from-hf": (["convert", "from-hf"], [(TorchDistWriter, "write_chunk")],
                "megatron_mtp.convert.from_hf.record_source", [".metadata", "config.yaml", "train_state.json"]),
    "drop-mtp": (["drop-mtp"], [(TorchDistWriter, "copy_chunk_blob")],
                 "megatron_mtp.convert.drop_mtp.copy_source_record", [".metadata", "config.yaml", "train_state.json"]),
}


@pytest.fixture
def command(request, trained_run, export_fp32, monkeypatch):
    """(argv without OUT, the same command as a function of OUT, its COMMANDS entry)."""
    from megatron_mtp.convert.drop_mtp import drop_mtp
    from megatron_mtp.convert.from_hf import import_from_hf
    from megatron_mtp.convert.to_hf import export_to_hf

    monkeypatch.setenv("MEGATRON_MTP_NO_PROGRESS", "1")
    name = request.param
    source = export_fp32 if name == "from-hf" else trained_run
    run = {"to-hf": export_to_hf, "from-hf": import_from_hf, "drop-mtp": drop_mtp}[name]
    head, writes, step, files = COMMANDS[name]
    # to-hf --for vllm: without --for, what a serving engine cannot do with the tiny model is a warning line
    extra, options = (["--for", "vllm"], {"serve_for": "vllm"}) if name == "to-hf" else ([], {})
    return [*head, str(source), *extra], lambda out: run(source, out, **options), writes, step, files


def _one_sentence(capsys, argv: list[str], start: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"megatron-mtp {argv[0]}: error: {start}"), err
    assert is_one_sentence(err.split(" error: ", 1)[1]), err
    return err


@pytest.mark.parametrize("command", list(COMMANDS), indirect=True)
def test_into_a_read_only_directory(command, tmp_path, monkeypatch, capsys):
    argv, _, _, _, _ = command
    real_mkdir = os.mkdir

    def mkdir(path, *args, **kwargs):  # a root test process cannot get EROFS or EACCES from a mode
        if os.path.abspath(os.fsdecode(path)).startswith(str(tmp_path)):
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    assert main([*argv, str(tmp_path / "out")]) == 2
    _one_sentence(capsys, argv, f"cannot write output '{tmp_path / 'out'}': the filesystem is read-only; "
                  "choose a place on a writable filesystem")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", list(COMMANDS), indirect=True)
def test_larger_than_the_free_space(command, tmp_path, monkeypatch, capsys):
    argv, _, _, _, _ = command
    monkeypatch.setattr(output, "free_bytes", lambda path: 1 << 10)
    assert main([*argv, str(tmp_path / "out")]) == 2
    _one_sentence(capsys, argv, f"output '{tmp_path / 'out'}' needs about ")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", list(COMMANDS), indirect=True)
def test_the_disk_fills_while_writing(command, tmp_path, monkeypatch, capsys):
    argv, _, writes, _, _ = command
    for cls, name in writes:
        real = getattr(cls, name)

        def full(self, *args, _real=real, **kwargs):  # the first tensor reaches the disk, then it is full
            _real(self, *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")

        monkeypatch.setattr(cls, name, full)
    assert main([*argv, str(tmp_path / "out")]) == 2
    err = _one_sentence(capsys, argv, f"cannot write output '{tmp_path / 'out'}': the filesystem is full (needs about ")
    assert err.endswith(" free); free space there or choose another place for it")
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("command", list(COMMANDS), indirect=True)
def test_another_writer_finishes_first(command, tmp_path, monkeypatch, capsys):
    argv, again, _, step, files = command
    out = tmp_path / "out"
    module, name = step.rsplit(".", 1)
    real = getattr(__import__(module, fromlist=[name]), name)
    raced = []

    def racing(*args, **kwargs):  # the same command into the same OUT, started later, finishes first
        if not raced:
            raced.append(out)
            again(out)
        return real(*args, **kwargs)

    monkeypatch.setattr(step, racing)
    assert main([*argv, str(out)]) == 2 and raced
    _one_sentence(capsys, argv, f"output '{out}' appeared while this command was writing it (another command "
                  "writing the same output finished first); that one was kept and this command's copy removed")
    assert os.listdir(tmp_path) == ["out"]
    assert all((out / f).is_file() for f in files), sorted(str(p.relative_to(out)) for p in Path(out).rglob("*"))
