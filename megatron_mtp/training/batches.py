"""Micro-batches for one data-parallel rank, resumable by consumed sample count.

Global batch g covers dataset samples [g·G, (g+1)·G). Micro-batch m of it gives DP rank r the
samples g·G + m·M·DP + r·M + [0, M) (M = micro batch size): every layout with the same global
batch sees the same samples per step, which is what makes TP/PP/EP/DP runs comparable.
"""

from __future__ import annotations

import torch

KEYS = ("tokens", "labels", "loss_mask", "position_ids")


class MicroBatchIterator:
    def __init__(self, dataset, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                 device: str = "cpu"):
        self.dataset = dataset
        self.position = consumed_samples
        self.mbs = micro_batch_size
        self.dp_rank = dp_rank
        self.dp_size = dp_size
        self.device = device

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        start = self.position + self.dp_rank * self.mbs
        items = [self.dataset[(start + i) % len(self.dataset)] for i in range(self.mbs)]
        self.position += self.mbs * self.dp_size
        keys = KEYS + (("attention_mask",) if "attention_mask" in items[0] else ())  # data.reset_attention_mask
        return {k: torch.stack([torch.as_tensor(item[k]) for item in items]).to(self.device, non_blocking=True)
                for k in keys}


def chunk_iterators(make, num_chunks: int):
    """What megatron-core's schedules take as data_iterator: one iterator, or with the interleaved
    schedule one per model chunk, each yielding the same micro-batches (`make()` builds one)."""
    return make() if num_chunks == 1 else [make() for _ in range(num_chunks)]
