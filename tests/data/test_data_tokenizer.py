"""Tokenizer wrapper: training, special tokens, round trip, saving for Hugging Face, loading errors."""

from __future__ import annotations

import json

import pytest

from megatron_mtp.data.tokenizer import BOS_TOKEN, EOD_TOKEN, load_tokenizer, train_bpe
from megatron_mtp.errors import UserError


def test_trained_bpe_has_special_tokens_and_round_trips(tokenizer, documents):
    assert tokenizer.bos_id == 0 and tokenizer.eod_id == 1
    assert tokenizer.vocab_size == 320
    for text in documents[:20] + ["", "  leading spaces\n\ttabs ✓ 日本"]:
        ids = tokenizer.encode(text)
        assert tokenizer.bos_id not in ids and tokenizer.eod_id not in ids
        assert tokenizer.decode(ids) == text
    # Merges were learned: code compresses well below one token per byte.
    sample = documents[0]
    assert len(tokenizer.encode(sample)) < 0.6 * len(sample.encode("utf-8"))


def test_saved_dir_loads_with_transformers(tokenizer_dir, tokenizer, documents):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoTokenizer.from_pretrained(str(tokenizer_dir))
    assert hf.eos_token == EOD_TOKEN and hf.bos_token == BOS_TOKEN
    assert hf.eos_token_id == tokenizer.eod_id and hf.bos_token_id == tokenizer.bos_id
    text = documents[3]
    assert hf.encode(text, add_special_tokens=False) == tokenizer.encode(text)
    assert hf.decode(tokenizer.encode(text)) == text


def test_load_from_file_and_resave(tmp_path, tokenizer_dir, tokenizer):
    from_file = load_tokenizer(tokenizer_dir / "tokenizer.json")
    assert from_file.eod_id == tokenizer.eod_id and from_file.vocab_size == tokenizer.vocab_size
    again = load_tokenizer(from_file.save(tmp_path / "copy"))
    assert again.fingerprint() == tokenizer.fingerprint()


def test_eod_taken_from_tokenizer_config(tmp_path, tokenizer_dir):
    # An HF-style dir whose eos_token is another token: the config wins over the default spellings.
    (tmp_path / "tokenizer.json").write_text((tokenizer_dir / "tokenizer.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"eos_token": {"content": BOS_TOKEN}}))
    assert load_tokenizer(tmp_path).eod_id == 0


def test_tokenizer_without_eod_fails_only_when_needed(tmp_path):
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models

    backend = HFTokenizer(models.WordLevel({"a": 0, "b": 1, "[UNK]": 2}, unk_token="[UNK]"))
    backend.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path)
    assert tok.eod_id is None and tok.vocab_size == 3
    with pytest.raises(UserError, match="no end-of-document token"):
        tok.require_eod()


@pytest.mark.parametrize("setup, message", [
    ("missing", "does not exist"),
    ("empty_dir", "has no tokenizer.json"),
    ("garbage", "cannot be read"),
])
def test_load_errors(tmp_path, setup, message):
    path = tmp_path / "tok"
    if setup == "empty_dir":
        path.mkdir()
    elif setup == "garbage":
        path.write_text("{not json")
    with pytest.raises(UserError, match=message):
        load_tokenizer(path)


def test_train_rejects_tiny_vocab(tmp_path):
    with pytest.raises(UserError, match="at least 258"):
        train_bpe(iter(["abc"]), 100, tmp_path)


def test_saved_tokenizer_files_are_readable_by_others(tokenizer, tmp_path):
    """Files are written atomically through a temp file, and get the usual permissions (umask), not
    the temp file's owner-only mode, so a team shares a tokenizer like any file."""
    import os
    import stat

    mask = os.umask(0o022)
    try:
        out = tokenizer.save(tmp_path / "tok")
    finally:
        os.umask(mask)
    files = [p for p in out.iterdir() if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o644 for p in files), [
        (p.name, oct(p.stat().st_mode)) for p in files]
