"""Weighted blends and splits go through megatron-core's builder and honour the config."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data
from megatron_mtp.data.preprocess import preprocess


@pytest.fixture(scope="module")
def three_sources(tmp_path_factory, tokenizer_dir, write_jsonl, documents):
    """Three datasets of different sizes whose tokens tell them apart (each doc starts with a marker)."""
    root = tmp_path_factory.mktemp("blend")
    prefixes = []
    for name, count in (("small", 40), ("medium", 80), ("large", 160)):
        texts = [f"# source {name}\n" + d for d in documents[:count]]
        write_jsonl(root / f"{name}.jsonl", texts)
        prefix = str(root / name)
        preprocess([str(root / f"{name}.jsonl")], str(tokenizer_dir), prefix, append_eod=True, progress=False)
        prefixes.append(prefix)
    return root, prefixes


def _cfg(root, tokenizer_dir, *overrides):
    return load_config(None, [f"data.tokenizer={tokenizer_dir}", f"data.cache_dir={root / 'cache'}",
                              "training.seq_length=32", *overrides])


@pytest.mark.parametrize("weights", [[1, 1, 2], [0.7, 0.2, 0.1]])
def test_blend_honours_weights(three_sources, tokenizer_dir, weights):
    root, prefixes = three_sources
    cfg = _cfg(root, tokenizer_dir, f"data.paths=[{','.join(prefixes)}]", f"data.weights={weights}",
               "data.split=90,10,0")
    resolved = resolve_data(cfg)
    check_data_config(cfg, resolved)
    n = 3000  # more than the small source holds: megatron-core repeats its epochs
    train, valid = build_datasets(cfg, resolved, n, 200)
    # megatron-core sizes a weighted blend as the sum of ceil(n * weight_i): at least n.
    train = train.built  # megatron-core's blend, as built for the planned samples
    assert n <= len(train) <= n + 3 and 200 <= len(valid) <= 203
    target = np.array(weights, dtype=float) / sum(weights)
    got = np.bincount(train.dataset_index, minlength=3) / len(train)
    np.testing.assert_allclose(got, target, atol=0.01)
    # Items come from the source the blend index names.
    for i in (0, 1, 7, 100):
        item = train[i]
        assert int(item["dataset_id"]) == int(train.dataset_index[i])
        assert item["tokens"].shape == (32,)


def test_unweighted_blend_follows_sizes_and_separate_valid_paths(three_sources, tokenizer_dir):
    root, prefixes = three_sources
    cfg = _cfg(root, tokenizer_dir, f"data.paths=[{prefixes[0]},{prefixes[2]}]", f"data.valid_paths=[{prefixes[1]}]")
    resolved = resolve_data(cfg)
    check_data_config(cfg, resolved)
    assert resolved.split is None and resolved.valid_prefixes == [prefixes[1]]
    train, valid = build_datasets(cfg, resolved, 500, 50)
    train = train.built
    sizes = np.array([len(ds) for ds in train.datasets], dtype=float)
    got = np.bincount(train.dataset_index, minlength=2) / len(train)
    np.testing.assert_allclose(got, sizes / sizes.sum(), atol=0.02)
    # Validation draws only from the held-out prefix.
    assert valid.dataset_path == prefixes[1] and len(valid) >= 50


def test_same_seed_same_order_and_new_seed_reshuffles(three_sources, tokenizer_dir):
    root, prefixes = three_sources
    first = []
    for seed in (1, 1, 2):
        cfg = _cfg(root, tokenizer_dir, f"data.paths=[{prefixes[1]}]", "data.split=100,0,0", f"training.seed={seed}")
        train, _ = build_datasets(cfg, resolve_data(cfg), 100, 0)
        first.append(np.stack([train[i]["tokens"].numpy() for i in range(5)]))
    np.testing.assert_array_equal(first[0], first[1])
    assert not np.array_equal(first[0], first[2])


def test_tokenizer_recorded_by_preprocess_is_used(three_sources, tokenizer_dir):
    root, prefixes = three_sources
    cfg = load_config(None, [f"data.paths=[{prefixes[0]}]", f"data.cache_dir={root / 'cache'}"])
    resolved = resolve_data(cfg)
    assert resolved.tokenizer_path == str(tokenizer_dir)
    assert resolved.train_blend == [(1.0, prefixes[0])] and resolved.split == "98,2,0"
