"""Feeding the ranks (training/batches.py): worker processes give the same micro-batches in the same
order as the in-process reader, a middle pipeline stage reads nothing, and the interleaved schedule's
chunks share one read of each micro-batch."""

from __future__ import annotations

import torch

from megatron_mtp.training.batches import KEYS, MicroBatchIterator, chunk_iterators, stage_keys


class Samples(torch.utils.data.Dataset):
    """GPTDataset-shaped items whose values encode their index; counts the reads made in this process."""

    def __init__(self, n: int = 50, seq: int = 8):
        self.n, self.seq, self.reads = n, seq, 0

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        self.reads += 1
        base = torch.arange(self.seq) + 100 * i
        return {"tokens": base, "labels": base + 1, "loss_mask": torch.ones(self.seq),
                "position_ids": torch.arange(self.seq)}


def test_workers_read_the_same_micro_batches_in_the_same_order():
    # DP rank 1 of 2, resumed after 36 samples, micro-batches of 3, wrapping around the 50 samples
    plain = MicroBatchIterator(Samples(), 36, 3, 1, 2)
    workers = MicroBatchIterator(Samples(), 36, 3, 1, 2, num_workers=2, prefetch=3)
    for step in range(12):
        a, b = next(plain), next(workers)
        assert set(a) == set(b) == set(KEYS)
        for key in KEYS:
            assert torch.equal(a[key], b[key]), (step, key)
    first = MicroBatchIterator(Samples(), 36, 3, 1, 2)
    assert next(first)["tokens"][:, 0].tolist() == [3900, 4000, 4100]  # samples 39-41: 36 + rank 1 x 3


def test_only_the_first_and_last_pipeline_stages_read():
    assert stage_keys(0, 4) == ("tokens", "position_ids")
    assert stage_keys(3, 4) == ("tokens", "position_ids", "labels", "loss_mask")
    assert stage_keys(1, 4) == () and stage_keys(0, 1) == stage_keys(3, 4)
    assert stage_keys(2, 4, attention_mask=True) == ("attention_mask",)
    data = Samples()
    middle = MicroBatchIterator(data, 0, 4, 0, 1, keys=stage_keys(1, 4), num_workers=2)
    assert [next(middle) for _ in range(5)] == [{}] * 5 and data.reads == 0
    first = next(MicroBatchIterator(data, 0, 4, 0, 1, keys=stage_keys(0, 4)))
    assert set(first) == {"tokens", "position_ids"} and data.reads == 4


def test_the_chunks_of_the_interleaved_schedule_share_one_read():
    data = Samples()
    views = chunk_iterators(lambda: MicroBatchIterator(data, 0, 2, 0, 1), 2)
    ahead = [next(views[0])["tokens"] for _ in range(3)]  # chunk 0 runs ahead (the warm-up), chunk 1 follows
    behind = [next(views[1])["tokens"] for _ in range(3)]
    assert all(torch.equal(a, b) for a, b in zip(ahead, behind))
    assert data.reads == 6  # three micro-batches of two, read once for both chunks
    assert not views[0].shared.batches  # nothing kept once both chunks took it
