"""JSONL -> indexed dataset: round trip through megatron-core's GPTDataset, determinism, gzip, CLI."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data
from megatron_mtp.data.indexed import check_indexed_pair
from megatron_mtp.data.preprocess import preprocess
from tests.workers.pool import POOL


def _read_back(prefix: str) -> list[list[int]]:
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    ds = IndexedDataset(prefix)
    return [ds[i].tolist() for i in range(len(ds))]


def test_round_trip_through_gpt_dataset(tmp_path, write_jsonl, documents, tokenizer, tokenizer_dir):
    docs = documents[:120]
    write_jsonl(tmp_path / "a.jsonl", docs[:70])
    write_jsonl(tmp_path / "b.jsonl.gz", docs[70:], compress=True)
    prefix = str(tmp_path / "out" / "corpus")
    stats = preprocess([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl.gz")], str(tokenizer_dir), prefix,
                       append_eod=True, progress=False)
    expected_docs = [tokenizer.encode(t) + [tokenizer.eod_id] for t in docs]
    assert stats.documents == len(docs) and stats.tokens == sum(map(len, expected_docs))
    # Document boundaries: one sequence per JSON line, EOD last.
    assert _read_back(prefix) == expected_docs
    info = check_indexed_pair(prefix)
    assert info.documents == len(docs) and info.dtype == np.uint16

    seq = 32
    cfg = load_config(None, [f"data.paths=[{prefix}]", f"data.tokenizer={tokenizer_dir}", "data.split=100,0,0",
                             f"data.cache_dir={tmp_path / 'cache'}", f"training.seq_length={seq}"])
    resolved = resolve_data(cfg)
    check_data_config(cfg, resolved)
    n_samples = (stats.tokens - 1) // seq  # exactly one epoch
    train, valid = build_datasets(cfg, resolved, n_samples, 0)
    train = train.built  # megatron-core's GPTDataset
    assert valid is None and len(train) == n_samples
    # GPTDataset shuffles documents (document_index) and samples (shuffle_index); undo the sample
    # shuffle and the samples must tile the document stream exactly, labels shifted by one.
    stream = np.concatenate([expected_docs[d] for d in train.document_index])
    position = np.empty(len(train), dtype=np.int64)
    position[train.shuffle_index] = np.arange(len(train))
    for k in range(len(train)):
        item = train[int(position[k])]
        np.testing.assert_array_equal(item["tokens"].numpy(), stream[k * seq:(k + 1) * seq])
        np.testing.assert_array_equal(item["labels"].numpy(), stream[k * seq + 1:(k + 1) * seq + 1])
        assert item["loss_mask"].min() == 1.0
        np.testing.assert_array_equal(item["position_ids"].numpy(), np.arange(seq))
    # document boundaries (data.eod_mask_loss, data.reset_attention_mask) on the same samples: no loss
    # where the input is the EOD, and each token attends to its own document only
    bounded = load_config(None, [f"data.paths=[{prefix}]", f"data.tokenizer={tokenizer_dir}", "data.split=100,0,0",
                                 f"data.cache_dir={tmp_path / 'cache'}", f"training.seq_length={seq}",
                                 "data.eod_mask_loss=true", "data.reset_attention_mask=true"])
    train = build_datasets(bounded, resolve_data(bounded), n_samples, 0)[0].built
    eod, seen = tokenizer.eod_id, 0
    causal = np.tril(np.ones((seq, seq), dtype=bool))
    for k in range(len(train)):
        item = train[int(position[k])]
        tokens = item["tokens"].numpy()
        np.testing.assert_array_equal(item["loss_mask"].numpy(), (tokens != eod).astype(np.float32))
        doc = np.concatenate([[0], np.cumsum(tokens == eod)[:-1]])  # a document starts after each EOD
        allowed = causal & (doc[:, None] == doc[None, :])
        np.testing.assert_array_equal(~item["attention_mask"].numpy()[0], allowed)  # True = masked
        seen += int((tokens[:-1] == eod).sum())
    assert seen > 10  # boundaries inside samples were checked


def test_without_append_eod_and_empty_documents(tmp_path, write_jsonl, tokenizer, tokenizer_dir):
    texts = ["x = 1\n", "", "y = 2\n"]
    write_jsonl(tmp_path / "a.jsonl", texts)
    prefix = str(tmp_path / "noeod")
    stats = preprocess([str(tmp_path / "a.jsonl")], str(tokenizer_dir), prefix, progress=False)
    assert stats.empty_documents == 1
    assert _read_back(prefix) == [tokenizer.encode("x = 1\n"), tokenizer.encode("y = 2\n")]


def test_output_identical_for_any_worker_count(tmp_path, write_jsonl, documents, tokenizer_dir):
    write_jsonl(tmp_path / "a.jsonl", documents)
    outputs = []
    for workers in (1, 2):
        prefix = str(tmp_path / f"w{workers}")
        # Small chunks so that both workers get many chunks and results interleave.
        preprocess([str(tmp_path / "a.jsonl")], str(tokenizer_dir), prefix, workers=workers, append_eod=True,
                   progress=False, chunk_bytes=2048)
        outputs.append(tuple(open(prefix + ext, "rb").read() for ext in (".bin", ".idx")))
    assert outputs[0] == outputs[1]
    assert len(outputs[0][0]) > 0


def test_cli_preprocess_and_tokenizer_train(tmp_path, write_jsonl, documents):
    write_jsonl(tmp_path / "a.jsonl", documents[:50], key="content")
    env = {"TOKENIZERS_PARALLELISM": "false"}
    cli = ["-m", "megatron_mtp"]  # on a warm rank of the suite (tests/workers)
    run = POOL.run(cli + ["tokenizer", "train", "--input", str(tmp_path / "a.jsonl"), "--text-key", "content",
                          "--vocab-size", "300", "--output", str(tmp_path / "tok")],
                   env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert sorted(os.listdir(tmp_path / "tok")) == [
        "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"
    ]
    run = POOL.run(cli + ["preprocess", "--input", str(tmp_path / "a.jsonl"), "--text-key", "content",
                          "--tokenizer", str(tmp_path / "tok"), "--output-prefix", str(tmp_path / "ds"),
                          "--workers", "1", "--append-eod"],
                   env=env, timeout=300)
    assert run.returncode == 0, run.stderr
    assert "50 documents" in run.stdout
    assert "docs/s" in run.stderr and "tokens/s" in run.stderr  # the progress bar
    assert check_indexed_pair(str(tmp_path / "ds")).documents == 50
    # A user mistake is one line on stderr and exit code 2, no traceback.
    run = POOL.run(cli + ["preprocess", "--input", str(tmp_path / "a.jsonl"),
                          "--tokenizer", str(tmp_path / "tok"),
                          "--output-prefix", str(tmp_path / "bad"), "--workers", "1", "--no-progress"],
                   env=env, timeout=300)
    assert run.returncode == 2
    assert "a.jsonl:1: the object has no 'text' key" in run.stderr and "Traceback" not in run.stderr
    assert not any(name.startswith("bad") for name in os.listdir(tmp_path))


def test_workers_run_from_any_main_and_report_dead_workers(tmp_path, write_jsonl, documents, tokenizer_dir):
    """Workers must not depend on re-running __main__ (a stdin script), and a worker that cannot
    start must fail the run instead of being respawned forever."""
    write_jsonl(tmp_path / "a.jsonl", documents[:40])
    script = (
        "from megatron_mtp.data.preprocess import preprocess\n"
        f"s = preprocess([{str(tmp_path / 'a.jsonl')!r}], {str(tokenizer_dir)!r}, {str(tmp_path / 'ds')!r}, "
        "workers=2, progress=False)\n"
        "print('DOCS', s.documents)\n"
    )
    env = dict(os.environ, OMP_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0 and "DOCS 40" in run.stdout, run.stderr[-2000:]

    from megatron_mtp.data.tokenizer import load_tokenizer

    tok = load_tokenizer(tokenizer_dir)
    tok.source = str(tmp_path / "vanished")  # workers load the tokenizer from here, which fails
    with pytest.raises(RuntimeError, match="worker process died"):
        preprocess([str(tmp_path / "a.jsonl")], tok, str(tmp_path / "ds2"), workers=2, progress=False)
    assert not any(n.startswith("ds2") for n in os.listdir(tmp_path))
