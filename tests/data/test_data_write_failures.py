"""`preprocess` and `tokenizer train` into a read-only place, onto a full disk, or racing another writer:
exit 2, one sentence on stderr, no temporary and no half-written output left; a finished output kept whole."""

from __future__ import annotations

import builtins
import errno
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mtp.cli import main
from megatron_mtp.data.indexed import IndexedWriter, check_indexed_pair
from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.errors import is_one_sentence

REPO = Path(__file__).resolve().parents[2]
FULL = "the filesystem is full ("
READ_ONLY = "the filesystem is read-only; choose a place on a writable filesystem"


def _one_sentence(capsys, command: str, start: str) -> str:
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert err.startswith(f"megatron-mtp {command}: error: {start}"), err
    assert is_one_sentence(err.split(" error: ", 1)[1]), err
    return err


def _read_only(monkeypatch, top: Path) -> None:
    """Nothing can be created under `top` (EROFS), whoever runs the test (root ignores a 0o555 mode)."""
    def refuse(path) -> bool:
        return os.path.abspath(os.fsdecode(path)).startswith(str(top))

    real_mkdir, real_open = os.mkdir, builtins.open

    def mkdir(path, *args, **kwargs):
        if refuse(path):
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(path))
        return real_mkdir(path, *args, **kwargs)

    def open_(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and set(mode) & set("wax+") and refuse(file):
            raise OSError(errno.EROFS, "Read-only file system", os.fsdecode(file))
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", mkdir)
    monkeypatch.setattr(builtins, "open", open_)


@pytest.fixture
def corpus(tmp_path, write_jsonl, documents) -> Path:
    return write_jsonl(tmp_path / "in.jsonl", documents[:60])


def _preprocess(corpus, tokenizer_dir, prefix) -> list[str]:
    return ["preprocess", "--input", str(corpus), "--tokenizer", str(tokenizer_dir), "--output-prefix", str(prefix),
            "--workers", "1", "--no-progress"]


def _train(corpus, out) -> list[str]:
    return ["tokenizer", "train", "--input", str(corpus), "--vocab-size", "300", "--output", str(out)]


def test_preprocess_into_a_read_only_directory(tmp_path, corpus, tokenizer_dir, monkeypatch, capsys):
    (tmp_path / "ro").mkdir()
    _read_only(monkeypatch, tmp_path / "ro")
    assert main(_preprocess(corpus, tokenizer_dir, tmp_path / "ro" / "ds")) == 2
    _one_sentence(capsys, "preprocess", f"cannot write dataset '{tmp_path / 'ro' / 'ds'}': {READ_ONLY}")
    assert os.listdir(tmp_path / "ro") == []


def test_preprocess_onto_a_full_disk(tmp_path, corpus, tokenizer_dir, monkeypatch, capsys):
    real_add = IndexedWriter.add

    def add(self, tokens, lengths):  # the documents go to disk, then the disk is full
        real_add(self, tokens, lengths)
        self._builder.data_file.flush()
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(IndexedWriter, "add", add)
    out = tmp_path / "out"
    out.mkdir()
    assert main(_preprocess(corpus, tokenizer_dir, out / "ds")) == 2
    err = _one_sentence(capsys, "preprocess", f"cannot write dataset '{out / 'ds'}': {FULL}needs more than ")
    assert err.endswith(" free); free space there or choose another place for it")
    assert os.listdir(out) == []


def test_preprocess_racing_another_writer_keeps_the_finished_dataset(tmp_path, corpus, tokenizer_dir, monkeypatch,
                                                                     capsys, write_jsonl, documents):
    other = write_jsonl(tmp_path / "other.jsonl", documents[100:130])
    winner = preprocess([str(other)], str(tokenizer_dir), str(tmp_path / "winner" / "ds"), progress=False)
    assert winner.documents == 30
    out = tmp_path / "out"
    real_commit = IndexedWriter.commit

    def commit(self, meta):  # the other command publishes the same dataset just before this one does
        for ext in (".meta.json", ".bin", ".idx"):
            shutil.copy(tmp_path / "winner" / f"ds{ext}", out / f"ds{ext}")
        real_commit(self, meta)

    monkeypatch.setattr(IndexedWriter, "commit", commit)
    assert main(_preprocess(corpus, tokenizer_dir, out / "ds")) == 2
    _one_sentence(capsys, "preprocess", f"dataset '{out / 'ds'}' appeared while this command was writing it "
                  "(another command writing the same output finished first); that one was kept and this "
                  "command's copy removed")
    assert sorted(os.listdir(out)) == ["ds.bin", "ds.idx", "ds.meta.json"]
    for ext in (".meta.json", ".bin", ".idx"):
        assert filecmp.cmp(out / f"ds{ext}", tmp_path / "winner" / f"ds{ext}", shallow=False)
    assert check_indexed_pair(str(out / "ds")).documents == 30
    # a re-run over a dataset that was there before it started replaces it, as before
    monkeypatch.setattr(IndexedWriter, "commit", real_commit)
    assert main(_preprocess(corpus, tokenizer_dir, out / "ds")) == 0
    assert check_indexed_pair(str(out / "ds")).documents == 60 and sorted(os.listdir(out)) == [
        "ds.bin", "ds.idx", "ds.meta.json"]


def test_tokenizer_train_into_a_read_only_directory(tmp_path, corpus, monkeypatch, capsys):
    (tmp_path / "ro").mkdir()
    _read_only(monkeypatch, tmp_path / "ro")
    assert main(_train(corpus, tmp_path / "ro" / "a" / "tok")) == 2
    _one_sentence(capsys, "tokenizer", f"cannot write output '{tmp_path / 'ro' / 'a' / 'tok'}': {READ_ONLY}")
    assert os.listdir(tmp_path / "ro") == []


def test_tokenizer_train_onto_a_full_disk(tmp_path, corpus, monkeypatch, capsys):
    from megatron_mtp.data import tokenizer

    real_write = tokenizer._atomic_write_text

    def write(path, text):
        if path.name == "tokenizer_config.json":
            raise OSError(errno.ENOSPC, "No space left on device")
        real_write(path, text)

    monkeypatch.setattr(tokenizer, "_atomic_write_text", write)
    assert main(_train(corpus, tmp_path / "tok")) == 2
    err = _one_sentence(capsys, "tokenizer", f"cannot write output '{tmp_path / 'tok'}': {FULL}needs more than ")
    assert err.endswith(" free); free space there or choose another place for it")
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl"]


def test_tokenizer_train_racing_another_writer_keeps_the_finished_tokenizer(tmp_path, corpus, tokenizer_dir,
                                                                           monkeypatch, capsys):
    from megatron_mtp.data import tokenizer

    out = tmp_path / "tok"
    real_train = tokenizer.train_bpe

    def train(*args, **kwargs):  # the other command finishes first
        result = real_train(*args, **kwargs)
        shutil.copytree(tokenizer_dir, out)
        return result

    monkeypatch.setattr(tokenizer, "train_bpe", train)
    assert main(_train(corpus, out)) == 2
    _one_sentence(capsys, "tokenizer", f"output '{out}' appeared while this command was writing it")
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "tok"]
    assert not filecmp.dircmp(out, tokenizer_dir).diff_files and sorted(os.listdir(out)) == sorted(
        os.listdir(tokenizer_dir))


_TMPFS = """
set -e
mount -t tmpfs -o size=8k tmpfs "$1/full"
mount -t tmpfs -o ro tmpfs "$1/ro"
for target in full ro; do
  "$2" -m megatron_mtp tokenizer train --input "$1/in.jsonl" --vocab-size 300 --output "$1/$target/tok" \
    >/dev/null 2>"$1/$target.err" && exit 9 || echo "$target $?"
  ls -A "$1/$target"
done
"""


def test_tokenizer_train_onto_a_real_full_and_read_only_filesystem(tmp_path, corpus):
    """The same, with the kernel's own errors: tmpfs mounts in a private mount namespace (needs root)."""
    if subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True).returncode:
        pytest.skip("no private mount namespace here (needs root and unshare)")
    (tmp_path / "full").mkdir()
    (tmp_path / "ro").mkdir()
    proc = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", _TMPFS, "sh", str(tmp_path),
                           sys.executable], capture_output=True, text=True, cwd=REPO, timeout=120)
    if proc.returncode and "mount" in proc.stderr:
        pytest.skip(f"tmpfs cannot be mounted here: {proc.stderr.strip()}")
    assert proc.returncode == 0 and proc.stdout.split() == ["full", "2", "ro", "2"], proc.stdout + proc.stderr
    full = (tmp_path / "full.err").read_text().strip()
    assert full.startswith(f"megatron-mtp tokenizer: error: cannot write output '{tmp_path / 'full' / 'tok'}': "
                           f"{FULL}") and len(full.splitlines()) == 1, full
    ro = (tmp_path / "ro.err").read_text().strip()
    assert ro == f"megatron-mtp tokenizer: error: cannot write output '{tmp_path / 'ro' / 'tok'}': {READ_ONLY}", ro
