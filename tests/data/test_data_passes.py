"""A run longer than its corpus reads it in passes, each in a new order, and says so at start; a
rollback past the planned samples reads on into a new pass instead of re-reading the first samples."""

from __future__ import annotations

import numpy as np
import pytest

from megatron_mtp.config import load_config
from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data
from megatron_mtp.data.preprocess import preprocess
from megatron_mtp.training.batches import MicroBatchIterator

SEQ = 32


@pytest.fixture(scope="module")
def two_prefixes(tmp_path_factory, tokenizer_dir, write_jsonl, documents):
    root = tmp_path_factory.mktemp("passes")
    prefixes = []
    for name, docs in (("a", documents[:30]), ("b", documents[30:50])):
        write_jsonl(root / f"{name}.jsonl", docs)
        preprocess([str(root / f"{name}.jsonl")], str(tokenizer_dir), str(root / name), append_eod=True,
                   progress=False)
        prefixes.append(str(root / name))
    return root, prefixes


def _cfg(root, tokenizer_dir, paths, samples, *extra):
    """A config whose plan (max_steps × global batch 8) is `samples` train samples."""
    return load_config(None, [f"data.tokenizer={tokenizer_dir}", f"data.cache_dir={root / 'cache'}",
                              f"data.paths=[{','.join(paths)}]", "data.split=100,0,0", f"training.seq_length={SEQ}",
                              "training.micro_batch_size=8", "training.global_batch_size=8",
                              f"training.max_steps={samples // 8}", "logging.eval_interval=0", *extra])


def _tokens(dataset, indices) -> np.ndarray:
    return np.stack([dataset[i]["tokens"].numpy() for i in indices])


def _one_pass(root, tokenizer_dir, paths) -> int:
    cfg = _cfg(root, tokenizer_dir, paths, 8)
    return len(build_datasets(cfg, resolve_data(cfg), 8, 0)[0].built)


def test_three_passes_over_an_unweighted_blend_are_announced_and_reshuffled(two_prefixes, tokenizer_dir):
    root, prefixes = two_prefixes
    n = _one_pass(root, tokenizer_dir, prefixes)  # an unweighted blend is built for one epoch
    planned = 3 * n // 8 * 8
    cfg = _cfg(root, tokenizer_dir, prefixes, planned)
    resolved = resolve_data(cfg)
    line = check_data_config(cfg, resolved)
    assert f"the run's {planned:,} samples are about 3.0 passes over its train data, each pass in a new order" \
        in line, line
    train, _ = build_datasets(cfg, resolved, planned, 0)
    assert len(train.built) == n
    orders = [[train.index(i) for i in range(p * n, (p + 1) * n)] for p in range(3)]
    for order in orders:  # every pass reads every built sample once
        assert sorted(order) == list(range(n))
    assert orders[0] == list(range(n))  # the first pass is megatron-core's own order
    assert orders[1] != orders[0] and orders[2] != orders[0] and orders[2] != orders[1]
    # and the samples themselves come in another order: pass 1's first batch is not pass 0's
    assert not np.array_equal(_tokens(train, range(8)), _tokens(train, range(n, n + 8)))
    # the same on every rank and data worker: a fresh build orders pass 2 alike
    again, _ = build_datasets(cfg, resolve_data(cfg), planned, 0)
    assert [again.index(i) for i in range(2 * n, 3 * n)] == orders[2]


@pytest.mark.parametrize("weighted", [False, True])
def test_a_rollback_past_the_planned_samples_does_not_reread_the_first(two_prefixes, tokenizer_dir, weighted):
    root, prefixes = two_prefixes
    paths = prefixes if weighted else prefixes[:1]
    extra = ["data.weights=[0.5,0.5]"] if weighted else []
    cfg = _cfg(root, tokenizer_dir, paths, 64, *extra)
    resolved = resolve_data(cfg)
    check_data_config(cfg, resolved)
    train, _ = build_datasets(cfg, resolved, 64, 0)
    built = len(train.built)
    assert built >= 64
    # consumed_samples after a rollback that skipped beyond what the run planned (and was built for)
    first = next(MicroBatchIterator(train, 0, 8, 0, 1))["tokens"].numpy()
    past = next(MicroBatchIterator(train, built, 8, 0, 1))["tokens"].numpy()
    assert [train.index(built + k) for k in range(8)] != list(range(8))
    assert not np.array_equal(first, past)
    # every sample read there is a real sample of the data (the tokens of some built sample)
    assert {train.index(built + k) for k in range(8)} <= set(range(built))


def test_a_run_within_one_pass_says_nothing_and_a_weighted_blend_names_its_most_repeated(two_prefixes,
                                                                                          tokenizer_dir):
    root, prefixes = two_prefixes
    cfg = _cfg(root, tokenizer_dir, prefixes, 8)
    assert "passes" not in check_data_config(cfg, resolve_data(cfg))
    n = _one_pass(root, tokenizer_dir, prefixes)
    cfg = _cfg(root, tokenizer_dir, prefixes, 2 * n // 8 * 8, "data.weights=[0.1,0.9]")
    line = check_data_config(cfg, resolve_data(cfg))
    assert "passes over dataset b, the most repeated of the blend, each pass in a new order" in line, line
    single = _one_pass(root, tokenizer_dir, prefixes[:1])  # a single prefix is built for the whole plan
    planned = -(-3 * single // 8) * 8
    cfg = _cfg(root, tokenizer_dir, prefixes[:1], planned)
    line = check_data_config(cfg, resolve_data(cfg))
    assert "samples are about 3.0 passes over its train data, each pass in a new order" in line, line
    train, _ = build_datasets(cfg, resolve_data(cfg), planned, 0)
    assert len(train.built) >= planned  # megatron-core's epochs, each shuffled anew


def test_every_pass_is_a_permutation_of_the_built_samples_whatever_their_number():
    from megatron_mtp.data.passes import Passes

    for n in (1, 2, 3, 7, 64, 65, 1000):
        passes = Passes(list(range(n)), seed=1234)
        orders = [[passes[p * n + j] for j in range(n)] for p in range(4)]
        assert all(sorted(order) == list(range(n)) for order in orders), n
        if n == 1000:  # unrelated to the first order and to each other (correlation ~ 0, sd 0.03)
            for a in range(4):
                for b in range(a + 1, 4):
                    assert abs(np.corrcoef(orders[a], orders[b])[0, 1]) < 0.15, (n, a, b)
    assert Passes(list(range(1000)), seed=1)[1500] != Passes(list(range(1000)), seed=2)[1500] or \
        Passes(list(range(1000)), seed=1)[1501] != Passes(list(range(1000)), seed=2)[1501]
