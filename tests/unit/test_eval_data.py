"""`megatron-mtp eval`: which tokens a checkpoint is scored on, alone and beside another (--compare)."""

from __future__ import annotations

from pathlib import Path

from megatron_mtp.config import load_config
from megatron_mtp.training.commands import _compare_note, _eval_data

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")


def test_the_split_is_named_for_the_data_it_comes_from():
    assert _eval_data(load_config(TINY), None, None).where == \
        "the validation split of the embedded default corpus (data.paths is null)"
    corpus = load_config(TINY, ["data.paths=[/data/corpus_text_document]"])
    assert _eval_data(corpus, None, None).where == "the validation split of data.paths"


def test_compare_says_when_its_checkpoint_is_scored_on_other_tokens_than_alone():
    trained = load_config(TINY)  # a run on the default corpus: its validation split
    imported = load_config(TINY, ["data.tokenizer=/models/base/tokenizer"])  # an import: held-out text windows
    on_trained = _eval_data(trained, None, None)
    note = _compare_note(Path("/ckpt/imported"), imported, on_trained, None, None)
    assert note and ("scores both checkpoints on the first one's tokens, the validation split of the embedded "
                     "default corpus (data.paths is null) in windows of 128, while /ckpt/imported alone is scored "
                     "on the default corpus's held-out files in windows of 128") in note, note
    note = _compare_note(Path("/ckpt/run"), trained, _eval_data(imported, None, None), None, None)
    assert note and "/ckpt/run alone is scored on the validation split of the embedded default corpus" in note
    other = load_config(TINY, ["data.paths=[/data/other_text_document]"])
    assert "the validation split of data.paths of its own data config" in _compare_note(
        Path("/ckpt/other"), other, _eval_data(load_config(TINY, ["data.paths=[/data/corpus_text_document]"]),
                                               None, None), None, None)
    assert _compare_note(Path("/ckpt/again"), load_config(TINY), on_trained, None, None) is None
