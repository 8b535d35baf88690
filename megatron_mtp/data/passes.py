"""Sample i of the training data for every i: passes over the built dataset, each in a new order.

Design note. megatron-core builds the train dataset for the samples the run plans
(`planned_train_samples`: training.max_steps × global batch): a single prefix or a weighted blend is
sized to them (GPTDataset repeats its documents in epochs, each shuffled anew), while an unweighted
blend holds exactly one epoch of each of its datasets. The trainer may read past that length: an
unweighted blend of a run longer than its corpus does after one epoch, and a loss-spike rollback
skips the samples since its checkpoint, so consumed_samples ends beyond the plan. The reader used to
wrap (`% len`), re-reading the first samples in their first order without a word.

`Passes` defines sample i for any i. With N the built dataset's length, i lies in pass p = i // N
at position j = i % N and reads built sample perm_p(j), where perm_0 is the identity (so a run
inside its plan reads what megatron-core built, in its order) and perm_p for p >= 1 is a permutation
of range(N) keyed by (training.seed, p): a 4-round Feistel network over the next even power of two
(BLAKE2b rounds), walked until it lands below N. It costs no memory (a run of 10^8 samples would need
0.8 GB per process for a stored permutation) and about 15 µs per sample on a busy 2-core box; it is the same
on every rank and in every data worker. Every pass thus holds the same samples in its own order. The
length is N × MAX_PASSES, which no run reaches, so the reader's `% len` never wraps.

`passes_note` is the start-up line's account of it: how many passes over its train data the planned
samples make, when more than one.
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Optional

import numpy as np

MAX_PASSES = 1 << 20
"""Passes a `Passes` dataset defines (its length is this many times the built dataset's)."""


def planned_train_samples(cfg: Any) -> int:
    """The train samples a run plans to read: training.max_steps × training.global_batch_size."""
    return cfg.training.max_steps * cfg.training.global_batch_size


class Passes:
    """The built train dataset read in passes, each pass in its own order (module note)."""

    def __init__(self, built, seed: int):
        self.built = built
        """megatron-core's dataset (GPTDataset or BlendedDataset) as built for the planned samples."""
        self.seed = seed
        self.size = len(built)
        half = max(1, (max(self.size - 1, 1).bit_length() + 1) // 2)
        self._half, self._mask = half, (1 << half) - 1

    def __len__(self) -> int:
        return self.size * MAX_PASSES

    def index(self, i: int) -> int:
        """The built sample that sample i reads."""
        if i < 0:
            raise IndexError(f"sample {i} is negative")
        p, j = divmod(int(i), self.size)
        if p == 0:
            return j
        keys = [f"{self.seed}:{p}:{r}".encode() for r in range(4)]
        while True:  # cycle-walking: a bijection of [0, 4^half) restricted to [0, size)
            j = self._feistel(j, keys)
            if j < self.size:
                return j

    def _feistel(self, x: int, keys: list[bytes]) -> int:
        left, right = x >> self._half, x & self._mask
        for key in keys:
            mixed = hashlib.blake2b(right.to_bytes(8, "little"), key=key, digest_size=8).digest()
            left, right = right, left ^ (int.from_bytes(mixed, "little") & self._mask)
        return (left << self._half) | right

    def __getitem__(self, i: int):
        return self.built[self.index(i)]


def passes_note(planned: int, seq_length: int, tokens: list[int], weights: Optional[list[float]],
                names: list[str]) -> str:
    """'; its N samples are about X passes over ...' when the planned samples read the train data of
    `tokens` (per dataset, train split only) more than once; '' otherwise."""
    total = sum(tokens)
    if total <= 0 or planned <= 0:
        return ""
    if weights is None:
        passes, where = planned * seq_length / total, "its train data"
    else:
        share = [w / sum(weights) for w in weights]
        each = [planned * s * seq_length / t if t > 0 else 0.0 for s, t in zip(share, tokens)]
        k = int(np.argmax(each))
        passes, where = each[k], f"dataset {os.path.basename(names[k])}"
        if len(tokens) > 1:
            where = f"{where}, the most repeated of the blend"
    if passes <= 1.0:
        return ""
    return (f"; the run's {planned:,} samples are about {passes:.1f} passes over {where}, each pass in a new "
            "order")
