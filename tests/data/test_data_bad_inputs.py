"""Every bad input gives one clear UserError naming where it is, and leaves no dataset behind."""

from __future__ import annotations

import gzip
import json
import os
import shutil
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import check_data_config, resolve_data
from megatron_mtp.data.indexed import check_indexed_pair
from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.errors import UserError

GOOD = json.dumps({"text": "x = 1\n"}) + "\n"


def _run(tmp_path, tokenizer_dir, content: bytes, **kwargs):
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    return preprocess([str(path)], str(tokenizer_dir), str(tmp_path / "out" / "ds"), progress=False, **kwargs)


def _no_output(tmp_path) -> bool:
    out = tmp_path / "out"
    return not out.exists() or os.listdir(out) == []


@pytest.mark.parametrize("bad_line, message", [
    (b'{"text": "unterminated\n', "in.jsonl:3: the line is not valid JSON"),
    (b'{"body": "x"}\n', "in.jsonl:3: the object has no 'text' key (keys: body)"),
    (b'{"text": 5}\n', "in.jsonl:3: the 'text' value is a int, not a string"),
    (b'["text"]\n', "in.jsonl:3: the line is a JSON list"),
    (b'{"text": "caf\xe9"}\n', "in.jsonl:3: the line holds bytes that are not UTF-8"),
    (b'{"text": "\\ud800"}\n', "in.jsonl:3: the text holds an unpaired surrogate"),
])
def test_bad_line_names_file_and_line(tmp_path, tokenizer_dir, bad_line, message):
    content = GOOD.encode() * 2 + bad_line + GOOD.encode() * 3
    with pytest.raises(UserError, match="--skip-bad-lines") as err:
        _run(tmp_path, tokenizer_dir, content)
    assert message in str(err.value)
    assert _no_output(tmp_path), "a failed run must leave no dataset or temporary files"


def test_skip_bad_lines_counts_and_reports(tmp_path, tokenizer_dir):
    content = (GOOD.encode() + b"{oops\n" + GOOD.encode() + b'{"t": 1}\n' + b"\xff\xfe\n" + b"\n" + GOOD.encode())
    stats = _run(tmp_path, tokenizer_dir, content, skip_bad_lines=True)
    assert stats.documents == 3
    assert stats.bad_lines == {"malformed JSON": 1, "missing text key": 1, "non-UTF-8 bytes": 1}
    assert stats.bad_examples[0].endswith(
        "in.jsonl:2: the line is not valid JSON (Expecting property name enclosed in double quotes at column 2)"
    )
    assert "skipped 3 bad lines" in stats.summary()
    meta = json.loads((tmp_path / "out" / "ds.meta.json").read_text())
    assert meta["skipped_lines"]["malformed JSON"] == 1


@pytest.mark.parametrize("content, message", [
    (b"", "input file '.*in.jsonl' is empty"),
    (b"\n\n", "holds no documents"),
    (b'{"oops"\n', "holds no documents"),
])
def test_empty_input(tmp_path, tokenizer_dir, content, message):
    with pytest.raises(UserError, match=message):
        _run(tmp_path, tokenizer_dir, content, skip_bad_lines=True)
    assert _no_output(tmp_path)


def test_missing_input_and_damaged_gzip(tmp_path, tokenizer_dir):
    with pytest.raises(UserError, match="does not exist"):
        preprocess([str(tmp_path / "nope.jsonl")], str(tokenizer_dir), str(tmp_path / "ds"), progress=False)
    data = gzip.compress(GOOD.encode() * 5000)
    (tmp_path / "cut.jsonl.gz").write_bytes(data[: len(data) // 2])
    with pytest.raises(UserError, match="damaged gzip file"):
        preprocess([str(tmp_path / "cut.jsonl.gz")], str(tokenizer_dir), str(tmp_path / "out" / "ds"), progress=False)
    assert _no_output(tmp_path)


def test_failed_rerun_keeps_no_stale_pair_looking_complete(tmp_path, tokenizer_dir):
    _run(tmp_path, tokenizer_dir, GOOD.encode() * 3)
    before = (tmp_path / "out" / "ds.idx").read_bytes()
    with pytest.raises(UserError):
        _run(tmp_path, tokenizer_dir, GOOD.encode() + b"{bad\n")
    # The previous complete dataset is untouched and no temporary files remain.
    assert (tmp_path / "out" / "ds.idx").read_bytes() == before
    assert sorted(os.listdir(tmp_path / "out")) == ["ds.bin", "ds.idx", "ds.meta.json"]


@pytest.fixture
def two_datasets(tmp_path, tokenizer_dir):
    a = tmp_path / "a.jsonl"
    b = tmp_path / "b.jsonl"
    a.write_text(GOOD * 40)
    b.write_text(json.dumps({"text": "def f():\n    return 2\n"}) + "\n" * 1 + GOOD * 10)
    preprocess([str(a)], str(tokenizer_dir), str(tmp_path / "A"), append_eod=True, progress=False)
    preprocess([str(b)], str(tokenizer_dir), str(tmp_path / "B"), append_eod=True, progress=False)
    return tmp_path / "A", tmp_path / "B"


def test_mismatched_bin_idx_pair(two_datasets):
    a, b = two_datasets
    shutil.copy(str(b) + ".bin", str(a) + ".bin")
    with pytest.raises(UserError, match="the .bin/.idx pair does not match"):
        check_indexed_pair(str(a))


def test_truncated_or_missing_files(two_datasets):
    a, b = two_datasets
    data = (b.parent / "B.idx").read_bytes()
    (b.parent / "B.idx").write_bytes(data[:-8])
    with pytest.raises(UserError, match="truncated or corrupt"):
        check_indexed_pair(str(b))
    os.unlink(str(a) + ".idx")
    with pytest.raises(UserError, match="has no A.idx"):
        check_indexed_pair(str(a))
    with pytest.raises(UserError, match="without the extension"):
        check_indexed_pair(str(b) + ".bin")


def _cfg(tmp_path, tokenizer_dir, *overrides):
    return load_config(None, [f"data.tokenizer={tokenizer_dir}", f"data.cache_dir={tmp_path / 'cache'}",
                              "training.seq_length=16", *overrides])


def test_config_vocab_exceeds_padded_model_vocab(tmp_path, tokenizer_dir, two_datasets):
    a, _ = two_datasets
    # The tokenizer has 320 tokens; 256 pads to 256 (divisible by 64), 300 pads to 320 (fits).
    cfg = _cfg(tmp_path, tokenizer_dir, f"data.paths=[{a}]", "model.vocab_size=256")
    with pytest.raises(UserError, match="has 320 tokens but the model's padded vocabulary is 256"):
        check_data_config(cfg, resolve_data(cfg))
    cfg = _cfg(tmp_path, tokenizer_dir, f"data.paths=[{a}]", "model.vocab_size=300")
    check_data_config(cfg, resolve_data(cfg))


@pytest.mark.parametrize("overrides, message", [
    (["data.weights=[1.0]"], "data.weights has 1 entries but data.paths has 2"),
    (["data.weights=[0, 0]"], "not all zero"),
    (["data.split=98;2"], "data.split is '98;2'"),
    (["data.split=0,100,0"], "the train part"),
    (["training.seq_length=100000"], "fewer than one sequence"),
    (["data.valid_weights=[1]"], "data.valid_weights is set but data.valid_paths is null"),
])
def test_config_errors(tmp_path, tokenizer_dir, two_datasets, overrides, message):
    a, b = two_datasets
    cfg = _cfg(tmp_path, tokenizer_dir, f"data.paths=[{a},{b}]", *overrides)
    with pytest.raises(UserError, match=message.replace("[", r"\[").replace("(", r"\(")):
        check_data_config(cfg, resolve_data(cfg))


def test_dataset_from_another_tokenizer(tmp_path, tokenizer_dir, two_datasets):
    from megatron_mtp.data.tokenizer import train_bpe

    a, _ = two_datasets
    other = tmp_path / "other_tok"
    train_bpe(iter(["some other text " * 50]), 300, other)
    cfg = _cfg(tmp_path, other, f"data.paths=[{a}]")
    with pytest.raises(UserError, match="tokenised with a tokenizer whose vocab_size is 320"):
        check_data_config(cfg, resolve_data(cfg))


def test_the_default_corpus_is_tokenised_with_the_runs_own_tokenizer(tmp_path, tokenizer_dir, tokenizer):
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    from megatron_mtp.data.default_corpus import select_files

    cfg = _cfg(tmp_path, tokenizer_dir, "data.default_corpus_max_bytes=150000")
    resolved = resolve_data(cfg)
    assert resolved.tokenizer_path == str(tokenizer_dir) and resolved.tokenizer.vocab_size == 320
    check_data_config(cfg, resolved)
    train, valid = select_files(150_000)
    for prefix, files in ((resolved.train_prefixes[0], train), (resolved.valid_prefixes[0], valid)):
        data = IndexedDataset(prefix)
        assert len(data) == len(files)
        for i in (0, len(files) - 1):  # each file is one document of the run's tokens, then its EOD
            assert data[i].tolist() == tokenizer.encode(files[i][1]) + [tokenizer.eod_id]
    # its splits are the corpus's own: a validation blend of the user's needs data.paths
    with pytest.raises(UserError, match="data.valid_paths is set but data.paths is null"):
        resolve_data(_cfg(tmp_path, tokenizer_dir, "data.valid_paths=[x]"))


def test_tokenizer_train_refuses_an_empty_input_and_an_existing_output(tmp_path, capsys):
    from megatron_mtp.cli import main

    (tmp_path / "empty.txt").write_text("")
    assert main(["tokenizer", "train", "--input", str(tmp_path / "empty.txt"), "--vocab-size", "512",
                 "--output", str(tmp_path / "tok")]) == 2
    err = capsys.readouterr().err.strip()
    assert "holds no text" in err and len(err.splitlines()) == 1, err
    assert not (tmp_path / "tok").exists() and [p.name for p in tmp_path.iterdir()] == ["empty.txt"]
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "mine.txt").write_text("keep me")
    (tmp_path / "text.txt").write_text("def f(x):\n    return x\n" * 50)
    assert main(["tokenizer", "train", "--input", str(tmp_path / "text.txt"), "--vocab-size", "300",
                 "--output", str(tmp_path / "taken")]) == 2
    err = capsys.readouterr().err.strip()
    assert f"output '{tmp_path / 'taken'}' already exists" in err and len(err.splitlines()) == 1, err
    assert [p.name for p in (tmp_path / "taken").iterdir()] == ["mine.txt"]


def test_train_refuses_a_big_recipe_on_the_default_corpus(tmp_path, capsys):
    from megatron_mtp.cli import main

    config = str(Path(__file__).resolve().parents[2] / "configs" / "qwen3_30b_a3b.yaml")
    assert main(["train", config, "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["megatron-mtp train: error: data.paths is not set, so this 31.2B-parameter model would train on "
                   "the embedded default corpus (the Python standard library, about 2 M tokens), which is for trying "
                   "the tiny recipes; set data.paths to your preprocessed corpus (`megatron-mtp preprocess`), or set "
                   "data.tokenizer to try the model on the default corpus with its own tokenizer"], err
    assert not (tmp_path / "run").exists()
