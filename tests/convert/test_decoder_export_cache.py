"""The decoder's export of a megatron-mtp run (inference/checkpoint_source.py) while a trainer saves
into it: a step that disappears mid-read falls back to the newest complete one, a cache entry is
published whole or not at all (one without its mark is rebuilt), and the cache is bounded."""

from __future__ import annotations

import shutil

import pytest

from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from megatron_mtp.inference import checkpoint_source
from megatron_mtp.inference.checkpoint_source import CACHE_ENTRIES, MARK, hf_dir_for


def in_process(ckpt, out):
    """What the decoder's child process runs (the cache rules are what is tested here, the child in
    test_checkpoint_arguments.py and tests/inference/test_infer_from_checkpoint.py)."""
    export_to_hf(str(ckpt), str(out), mtp="separate", dtype="fp32")


@pytest.fixture
def run(trained_run, tmp_path, monkeypatch):
    """A copy of the trained run with two steps, `latest` naming the second; its own export cache."""
    monkeypatch.setenv("MEGATRON_MTP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(checkpoint_source, "export_checkpoint", in_process)
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy)
    root = copy / "checkpoints"
    first = root / (root / "latest").read_text().strip()
    second = root / "step_0000099"
    shutil.copytree(first, second)
    (root / "latest").write_text(second.name)
    return copy, first, second


def test_a_step_removed_while_it_is_read_falls_back_to_the_newest_complete_one(run, monkeypatch, capfd):
    copy, first, second = run
    calls = []

    def removed_mid_read(ckpt, out):  # a trainer's keep_last deletes the step being exported
        calls.append(ckpt)
        if len(calls) == 1:
            shutil.rmtree(second)
        return in_process(ckpt, out)

    monkeypatch.setattr(checkpoint_source, "export_checkpoint", removed_mid_read)
    out = hf_dir_for(copy)
    assert calls == [second, first]
    assert (out / MARK).read_text().strip() == str(first)
    assert (out / "main" / "tokenizer.json").is_file() and (out / "mtp" / "config.json").is_file()
    assert f"note: {second} was removed while it was read" in capfd.readouterr().err
    assert not [p for p in out.parent.iterdir() if ".tmp" in p.name]  # nothing half-written stays

    named = copy / "checkpoints" / "step_0000100"
    shutil.copytree(first, named)
    monkeypatch.setattr(checkpoint_source, "export_checkpoint", lambda ckpt, out: shutil.rmtree(named))
    with pytest.raises(UserError, match="was removed or replaced while it was read .* pass the run directory"):
        hf_dir_for(named)  # a step named directly: one sentence


def test_an_entry_without_its_mark_is_rebuilt_and_the_cache_keeps_the_most_recent(run):
    copy, first, second = run
    out = hf_dir_for(copy)
    (out / MARK).unlink()
    (out / "main" / "tokenizer.json").unlink()  # what a half-published entry looked like
    assert hf_dir_for(copy) == out and (out / "main" / "tokenizer.json").is_file() and (out / MARK).is_file()
    steps = [second]
    for n in range(CACHE_ENTRIES + 1):
        steps.append(copy / "checkpoints" / f"step_00001{n:02d}")
        shutil.copytree(first, steps[-1])
        hf_dir_for(steps[-1])
    kept = sorted(p for p in out.parent.iterdir() if p.is_dir())
    assert len(kept) == CACHE_ENTRIES and all((p / MARK).is_file() for p in kept)
    assert {(p / MARK).read_text().strip() for p in kept} == {str(s) for s in steps[-CACHE_ENTRIES:]}
