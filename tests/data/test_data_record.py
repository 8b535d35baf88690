"""The datasets a run resolved are held to at resume: a glob that now matches more, or fewer, datasets is
one sentence unless data.allow_changed_paths accepts it (then a note)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import resolve_data
from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.data.record import prefix_record, refuse_changed_prefixes
from megatron_mtp.errors import UserError, is_one_sentence


@pytest.fixture()
def parts(tmp_path, tokenizer_dir, write_jsonl, documents):
    for i in range(3):
        write_jsonl(tmp_path / f"part-{i}.jsonl", documents[i * 10:(i + 1) * 10])
        preprocess([str(tmp_path / f"part-{i}.jsonl")], str(tokenizer_dir), str(tmp_path / f"part-{i}"),
                   append_eod=True, progress=False)
    return tmp_path


def _resolve(root: Path, tokenizer_dir, *extra):
    return resolve_data(load_config(None, [f"data.paths=[{root / 'part-*'}]", f"data.tokenizer={tokenizer_dir}",
                                           f"data.cache_dir={root / 'cache'}", *extra]))


def test_a_glob_matching_other_datasets_at_resume_is_one_sentence(parts, tokenizer_dir):
    saved = {"step": 4, "data_prefixes": prefix_record(_resolve(parts, tokenizer_dir))}
    assert saved["data_prefixes"]["train"] == [str(parts / f"part-{i}") for i in range(3)]
    step, run = Path("/runs/r/checkpoints/step_0000004"), Path("/runs/r")
    assert refuse_changed_prefixes(saved, _resolve(parts, tokenizer_dir), False, step, run) is None
    for ext in (".bin", ".idx", ".meta.json"):  # one more dataset the glob now matches
        shutil.copy(parts / f"part-2{ext}", parts / f"part-3{ext}")
    with pytest.raises(UserError) as more:
        refuse_changed_prefixes(saved, _resolve(parts, tokenizer_dir), False, step, run)
    assert str(more.value) == (
        "cannot resume /runs/r from step_0000004: its train datasets resolve to 4 datasets where the checkpoint "
        "read 3: 1 new (part-3), which changes the order of every sample from here on (a glob in data.paths sees "
        "other shards?); restore the datasets the run read, or accept the new ones with "
        "data.allow_changed_paths=true")
    assert is_one_sentence(str(more.value))
    for ext in (".bin", ".idx", ".meta.json"):  # and one fewer
        os.unlink(parts / f"part-3{ext}")
    os.unlink(parts / "part-0.idx")
    with pytest.raises(UserError, match=r"resolve to 2 datasets where the checkpoint read 3: 1 no longer found "
                                        r"\(part-0\)"):
        refuse_changed_prefixes(saved, _resolve(parts, tokenizer_dir), False, step, run)
    # the override key accepts it, with a note for the start-up lines
    allowed = _resolve(parts, tokenizer_dir, "data.allow_changed_paths=true")
    note = refuse_changed_prefixes(saved, allowed, True, step, run)
    assert note.startswith("the data differs from step_0000004's (its train datasets resolve to 2 datasets")
    # a checkpoint from before the record resumes as before
    assert refuse_changed_prefixes({"step": 4}, allowed, False, step, run) is None


def test_the_default_corpus_is_recorded_as_such(parts, tokenizer_dir):
    class Default:
        default_corpus = object()

    saved = {"data_prefixes": prefix_record(Default())}
    assert saved["data_prefixes"] == {"default_corpus": True}
    step, run = Path("/r/checkpoints/step_0000002"), Path("/r")
    assert refuse_changed_prefixes(saved, Default(), False, step, run) is None
    with pytest.raises(UserError, match="it was trained on the default corpus and this start reads data.paths"):
        refuse_changed_prefixes(saved, _resolve(parts, tokenizer_dir), False, step, run)
