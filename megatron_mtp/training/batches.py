"""Micro-batches for one data-parallel rank, resumable by consumed sample count.

Global batch g covers dataset samples [g·G, (g+1)·G). Micro-batch m of it gives DP rank r the
samples g·G + m·M·DP + r·M + [0, M) (M = micro batch size): every layout with the same global
batch sees the same samples per step, which is what makes TP/PP/EP/DP runs comparable.

Design note (feeding the ranks).
- Only what a stage uses is read (`stage_keys`): the first pipeline stage takes tokens and positions,
  the last one those (its MTP layers embed the tokens) and the labels and loss mask; a middle stage
  reads nothing (megatron-core passes it activations), except the attention mask of
  data.reset_attention_mask, which every stage's attention takes. A rank that reads nothing never
  touches the dataset, so its pages and its workers cost nothing.
- data.num_workers > 0 reads through a torch DataLoader of that many worker processes over the same
  sample order (a batch sampler), each keeping `prefetch` micro-batches ahead, so reading overlaps the
  step; the batches are the same, in the same order, as the in-process reader's (tested).
- With the interleaved schedule, megatron-core takes one iterator per model chunk and draws the same
  micro-batches through each; `chunk_iterators` gives them views of one reader, so a micro-batch is
  read once however many chunks a rank holds.
"""

from __future__ import annotations

import torch

KEYS = ("tokens", "labels", "loss_mask", "position_ids")


def stage_keys(pp_rank: int, pp: int, attention_mask: bool = False) -> tuple[str, ...]:
    """The batch fields pipeline rank `pp_rank` of `pp` uses (see the module note)."""
    first, last = pp_rank == 0, pp_rank == pp - 1
    keys = (("tokens", "position_ids") if first or last else ()) + (("labels", "loss_mask") if last else ())
    return keys + (("attention_mask",) if attention_mask else ())


class _Order:
    """The micro-batches' sample indices for one DP rank, from a consumed-sample count (a batch sampler)."""

    def __init__(self, size: int, consumed: int, mbs: int, dp_rank: int, dp: int):
        self.size, self.position, self.mbs, self.dp_rank, self.dp = size, consumed, mbs, dp_rank, dp

    def __iter__(self):
        while True:
            start = self.position + self.dp_rank * self.mbs
            self.position += self.mbs * self.dp
            yield [(start + i) % self.size for i in range(self.mbs)]


class _Collate:
    def __init__(self, keys: tuple[str, ...]):
        self.keys = keys

    def __call__(self, items: list) -> dict[str, torch.Tensor]:
        return {k: torch.stack([torch.as_tensor(item[k]) for item in items]) for k in self.keys}


class MicroBatchIterator:
    def __init__(self, dataset, consumed_samples: int, micro_batch_size: int, dp_rank: int, dp_size: int,
                 device: str = "cpu", keys: tuple[str, ...] = KEYS, num_workers: int = 0, prefetch: int = 2):
        self.dataset = dataset
        self.device = device
        self.keys = keys
        self._order = iter(_Order(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size))
        self._collate = _Collate(keys)
        self._loader = None
        if keys and num_workers > 0:
            self._loader = iter(torch.utils.data.DataLoader(
                dataset, batch_sampler=_Order(len(dataset), consumed_samples, micro_batch_size, dp_rank, dp_size),
                num_workers=num_workers, prefetch_factor=prefetch, collate_fn=self._collate,
                pin_memory=str(device).startswith("cuda")))

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, torch.Tensor]:
        if not self.keys:  # a middle pipeline stage: nothing to read
            return {}
        if self._loader is not None:
            batch = next(self._loader)
        else:
            batch = self._collate([self.dataset[i] for i in next(self._order)])
        return {k: v.to(self.device, non_blocking=True) for k, v in batch.items()}


class _ChunkView:
    """One model chunk's iterator over a reader shared by the rank's chunks: its n-th next() is the
    reader's n-th micro-batch, kept until every chunk has taken it."""

    def __init__(self, shared: "_Shared"):
        self.shared, self.taken = shared, 0

    def __iter__(self):
        return self

    def __next__(self):
        batch = self.shared.get(self.taken)
        self.taken += 1
        self.shared.release()
        return batch


class _Shared:
    def __init__(self, reader):
        self.reader = reader
        self.batches: dict[int, dict] = {}
        self.read = 0
        self.views: list[_ChunkView] = []

    def get(self, n: int):
        while self.read <= n:
            self.batches[self.read] = next(self.reader)
            self.read += 1
        return self.batches[n]

    def release(self) -> None:
        low = min(v.taken for v in self.views)
        for n in [n for n in self.batches if n < low]:
            del self.batches[n]


def chunk_iterators(make, num_chunks: int):
    """What megatron-core's schedules take as data_iterator: one iterator, or with the interleaved
    schedule one per model chunk, each yielding the same micro-batches from one reader (`make()`)."""
    if num_chunks == 1:
        return make()
    state = _Shared(make())
    state.views = [_ChunkView(state) for _ in range(num_chunks)]
    return state.views
