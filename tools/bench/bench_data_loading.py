"""Does a training step wait on reading? Step time of the trainer's micro-batch reader with a slow
disk simulated (a sleep per sample read), in-process (data.num_workers=0) against worker processes
(data.num_workers=N), side by side in one run, on the default corpus's real GPTDataset.

The step is simulated too (a sleep: on a GPU the step does not use the host's cores), so the ratio is
what reading costs a step, not the CPU contention of this machine:
  python tools/bench/bench_data_loading.py [--read-ms 4] [--step-ms 40] [--workers 2] [--steps 40]
"""

from __future__ import annotations

import argparse
import time


class SlowDisk:
    """A dataset whose every sample read takes `read_ms` longer (a cold, remote or busy filesystem)."""

    def __init__(self, dataset, read_ms: float):
        self.dataset, self.read_s = dataset, read_ms / 1000

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, i):
        time.sleep(self.read_s)
        return self.dataset[i]


def step_times(dataset, workers: int, args) -> float:
    from megatron_mtp.training.batches import MicroBatchIterator

    batches = MicroBatchIterator(dataset, 0, args.micro_batch, 0, 1, num_workers=workers, prefetch=2)
    for _ in range(args.warmup):
        next(batches)
    start = time.perf_counter()
    for _ in range(args.steps):
        for _ in range(args.micro_batches):
            next(batches)
        time.sleep(args.step_ms / 1000)  # the step: the accelerator works, the host waits
    return (time.perf_counter() - start) / args.steps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--read-ms", type=float, default=4.0, help="simulated time to read one sample")
    p.add_argument("--step-ms", type=float, default=40.0, help="simulated step time")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--micro-batches", type=int, default=2, help="micro-batches per step")
    args = p.parse_args()

    from megatron_mtp.config import load_config
    from megatron_mtp.data.datasets import build_datasets, resolve_data

    cfg = load_config(None, ["training.seq_length=512"])
    samples = (args.steps + args.warmup + 8) * args.micro_batch * args.micro_batches
    train, _ = build_datasets(cfg, resolve_data(cfg), samples, 0)
    slow = SlowDisk(train, args.read_ms)
    reading = args.read_ms * args.micro_batch * args.micro_batches
    print(f"step {args.step_ms:.0f} ms + reading {reading:.0f} ms per step ({args.micro_batches} micro-batches of "
          f"{args.micro_batch} samples, {args.read_ms:g} ms per sample read)")
    inline = step_times(slow, 0, args)
    ahead = step_times(slow, args.workers, args)
    print(f"num_workers=0: {inline * 1000:.1f} ms per step")
    print(f"num_workers={args.workers}: {ahead * 1000:.1f} ms per step")
    print(f"ratio (workers / in-process): {ahead / inline:.3f}; the step alone: {args.step_ms / 1000 / inline:.3f}")


if __name__ == "__main__":
    main()
