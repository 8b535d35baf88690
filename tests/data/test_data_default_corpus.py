"""The embedded default corpus: recipe, first-use build, cache reuse, concurrent callers, training API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data
from megatron_mtp.data.default_corpus import corpus_key, ensure_default_corpus, select_files, stdlib_source_files
from megatron_mtp.data.indexed import check_indexed_pair
from megatron_mtp.data.tokenizer import load_tokenizer

SMALL = 400_000  # bytes of source: builds in seconds


@pytest.fixture(scope="module")
def small_corpus(tmp_path_factory):
    cache = tmp_path_factory.mktemp("cache")
    return cache, ensure_default_corpus(str(cache), vocab_size=512, max_bytes=SMALL, progress=False)


def test_recipe_excludes_tests_and_splits_by_file():
    files = stdlib_source_files()
    assert "json/decoder.py" in files
    assert not any(part in ("test", "tests", "idle_test", "site-packages") for f in files for part in f.split(os.sep))
    assert not any(os.path.basename(f).startswith("test_") for f in files)
    train, valid = select_files(SMALL)
    assert train and valid
    assert not {r for r, _ in train} & {r for r, _ in valid}
    assert sum(len(t.encode()) for _, t in train + valid) <= SMALL
    assert (train, valid) == select_files(SMALL)  # deterministic


def test_build_and_reuse(small_corpus):
    cache, corpus = small_corpus
    manifest = json.loads(open(os.path.join(corpus.root, "manifest.json")).read())
    tok = load_tokenizer(corpus.tokenizer_dir)
    assert tok.vocab_size == 512 and tok.eod_id == 1
    train, valid = check_indexed_pair(corpus.train_prefix), check_indexed_pair(corpus.valid_prefix)
    assert train.documents == manifest["splits"]["train"]["files"]
    assert valid.documents == len(manifest["valid_files"]) >= 1
    assert train.tokens == manifest["splits"]["train"]["tokens"] > valid.tokens > 0
    # The held-out files are the recipe's validation files.
    _, valid_files = select_files(SMALL)
    assert [r for r, _ in valid_files] == manifest["valid_files"]
    # The same call again is a cache hit; another vocabulary is another corpus.
    again = ensure_default_corpus(str(cache), vocab_size=512, max_bytes=SMALL, progress=False)
    assert again == corpus
    assert corpus_key(512, SMALL) != corpus_key(1024, SMALL) != corpus_key(512, SMALL // 2)
    assert os.path.basename(corpus.root) == corpus_key(512, SMALL)


def test_concurrent_first_use_builds_once(tmp_path):
    script = textwrap.dedent(f"""
        from megatron_mtp.data.default_corpus import ensure_default_corpus
        c = ensure_default_corpus({str(tmp_path)!r}, vocab_size=300, max_bytes=150_000, progress=False)
        print("ROOT", c.root)
    """)
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for _ in range(2)]
    results = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [r[1] for r in results]
    roots = {line for out, _ in results for line in out.splitlines() if line.startswith("ROOT")}
    assert len(roots) == 1
    builds = sum(err.count("building the default corpus") for _, err in results)
    assert builds == 1
    base = tmp_path / "default_corpus"
    assert not [n for n in os.listdir(base) if ".tmp-" in n]


def test_training_api_on_default_corpus(small_corpus):
    cache, corpus = small_corpus
    cfg = load_config(None, [f"data.cache_dir={cache}", "data.default_corpus_vocab_size=512",
                             f"data.default_corpus_max_bytes={SMALL}", "training.seq_length=64",
                             "model.vocab_size=512"])
    resolved = resolve_data(cfg)
    assert resolved.default_corpus == corpus
    assert resolved.train_prefixes == [corpus.train_prefix] and resolved.valid_prefixes == [corpus.valid_prefix]
    check_data_config(cfg, resolved)
    train, valid = build_datasets(cfg, resolved, 64, 16)
    assert len(train) >= 64 and len(valid) >= 16
    text = resolved.tokenizer.decode(train[0]["tokens"].tolist() + valid[0]["tokens"].tolist())
    assert any(word in text for word in ("def ", "import ", "self", "return"))
    # The model's padded vocabulary must hold the tokenizer.
    small = load_config(None, [f"data.cache_dir={cache}", "data.default_corpus_vocab_size=512",
                               f"data.default_corpus_max_bytes={SMALL}", "model.vocab_size=100"])
    from megatron_mtp.errors import UserError

    with pytest.raises(UserError, match="raise model.vocab_size"):
        check_data_config(small, resolve_data(small))
