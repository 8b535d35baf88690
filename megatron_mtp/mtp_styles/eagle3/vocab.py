"""The draft vocabulary: the ``mtp.eagle3.draft_vocab_size`` most frequent tokens of the training data, and its
tables as speculators keeps them.

``d2t`` [N] int64: the target id of draft index i is i + d2t[i] (the chosen ids in increasing order, so the offsets
never decrease); ``t2d`` [V] bool: whether target id v is drafted. Ties in frequency go to the lower id, and with
fewer than N distinct tokens seen the lowest unseen ids fill the rest (speculators' rule). The counts are read
from the train prefixes' token files (the first ``mtp.eagle3.vocab_count_tokens`` tokens, shared out equally over
the prefixes): every rank reads the same bytes and picks the same vocabulary, with no communication.
"""

from __future__ import annotations

import numpy as np
import torch


def count_tokens(prefixes: list[str], vocab: int, budget: int) -> torch.Tensor:
    """[vocab] int64 occurrences of each id among the first ``budget`` tokens, shared out over ``prefixes``."""
    from megatron_mtp.data.indexed import check_indexed_pair

    counts = np.zeros(vocab, dtype=np.int64)
    share = max(budget // max(len(prefixes), 1), 1)
    for prefix in prefixes:
        info = check_indexed_pair(prefix)
        tokens = np.memmap(prefix + ".bin", dtype=info.dtype, mode="r")
        seen = np.bincount(np.asarray(tokens[:share], dtype=np.int64), minlength=vocab)
        counts += seen[:vocab]
    return torch.from_numpy(counts)


def draft_vocabulary(counts: torch.Tensor, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(d2t [size] int64, t2d [len(counts)] bool) of the ``size`` most frequent ids (module note)."""
    order = torch.sort(-counts.to(torch.long), stable=True).indices[:size]  # by count, then the lower id
    chosen = order.sort().values
    t2d = torch.zeros(counts.numel(), dtype=torch.bool)
    t2d[chosen] = True
    return chosen - torch.arange(size), t2d


def train_counts(cfg, vocab: int) -> torch.Tensor:
    """Token counts of run config ``cfg``'s training data (its train prefixes, the default corpus's included)."""
    from megatron_mtp.data.datasets import resolve_data

    return count_tokens(resolve_data(cfg).train_prefixes, vocab, cfg.mtp.eagle3.vocab_count_tokens)
