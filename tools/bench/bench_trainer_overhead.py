"""Trainer overhead: our training step over a bare megatron-core forward_backward + optimizer loop,
on the same model and data in one process. Target: ratio <= 1.05.

    .venv/bin/python tools/bench/bench_trainer_overhead.py [--hidden 512 --seq 512 ...]

"Ours" is Trainer.train_step, which includes the per-step agreement of all ranks on non-finite
losses, stop signals and the LM loss (one small all-reduce) and the guarded optimizer step —
everything the loop does every step; logging/eval/checkpoint intervals are excluded on both sides. The bare
loop is what a user would write with megatron-core alone (schedule, optimizer step, LR step).
The same step is also run with its phase timers taken out (target: timers <= 1% of a step).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from _train_bench import model_arguments

    model_arguments(ap)
    args = ap.parse_args()

    import torch
    from _train_bench import RandomTokens, bare_step, interleaved, scratch_dir, single_process_setup, trainer_step

    from megatron_mtp.training.batches import MicroBatchIterator
    from megatron_mtp.training.distributed import destroy

    cfg, plat, vocab = single_process_setup(args)
    ds = RandomTokens(vocab, args.seq)
    trainer, ours = trainer_step(cfg, plat, vocab, ds, scratch_dir("bench_trainer_"))
    components = trainer.components
    bare_data = MicroBatchIterator(ds, 0, args.micro_batch, 0, 1, device=plat.device)

    def bare():
        bare_step(components, bare_data, 1, args.seq, args.micro_batch)

    timers = trainer.times  # the phase timers (training/phase_times.py), and the same step without them
    untimed = _Untimed()

    def ours_untimed():
        trainer.times = untimed
        try:
            ours()
        finally:
            trainer.times = timers

    times = interleaved({"ours": ours, "bare": bare, "untimed": ours_untimed}, rounds=args.rounds,
                        steps_per_round=args.steps_per_round)
    print(f"model: hidden {args.hidden}, layers {args.layers}, seq {args.seq}, vocab {vocab}, "
          f"micro batch {args.micro_batch}, MTP D={cfg.mtp.num_layers}, device {plat.device}, "
          f"threads {torch.get_num_threads()}")
    print(f"step time ours: {times['ours'] * 1e3:.1f} ms   bare megatron-core: {times['bare'] * 1e3:.1f} ms")
    print(f"ratio ours / bare: {times['ours'] / times['bare']:.3f} (target <= 1.05)")
    print(f"phase timers: step {times['ours'] * 1e3:.1f} ms with them, {times['untimed'] * 1e3:.1f} ms without; "
          f"ratio {times['ours'] / times['untimed']:.3f} (target <= 1.01)")
    destroy()


class _Untimed:
    """PhaseTimes' interface, timing nothing."""

    @contextlib.contextmanager
    def phase(self, name):
        yield

    def timed(self, iterator):
        return iterator


if __name__ == "__main__":
    main()
