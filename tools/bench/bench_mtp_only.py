"""MTP-only step cost: the training step with mtp.freeze_base over the full training step of the same
model (MTP D=1), and over its FLOPs-predicted value (main model forward, MTP module forward and
backward: models/sizes.py mtp_only_flops_per_token), as ratios measured in one run.
Target: within 10% of predicted.

    .venv/bin/python tools/bench/bench_mtp_only.py [--hidden 512 --layers 4 --seq 512 ...]

One process (CPU/gloo or one GPU); both variants are built in the same process from the same initial
weights and timed in alternating blocks through the real trainer step (Trainer.train_step: the frozen
variant runs its forward-only schedule with the MTP backward in the loss function).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from _train_bench import model_arguments

    model_arguments(ap)
    args = ap.parse_args()

    import torch
    from _train_bench import RandomTokens, interleaved, scratch_dir, single_process_setup, trainer_step

    from megatron_mtp.models.family import get_family
    from megatron_mtp.models.sizes import mtp_only_flops_per_token
    from megatron_mtp.training.distributed import destroy

    base, plat, vocab = single_process_setup(args)
    base = base.replace(mtp=dataclasses.replace(base.mtp, num_layers=1))
    data_set = RandomTokens(vocab, args.seq)
    run_dir = scratch_dir("bench_mtp_only_")
    steps = {}
    for name, frozen in (("full", False), ("mtp_only", True)):
        cfg = base.replace(mtp=dataclasses.replace(base.mtp, freeze_base=frozen))
        _, steps[name] = trainer_step(cfg, plat, vocab, data_set, run_dir / name)
    times = interleaved(steps, rounds=args.rounds, steps_per_round=args.steps_per_round)
    measured = times["mtp_only"] / times["full"]
    family = get_family(base.model.family)
    predicted = mtp_only_flops_per_token(family, base, vocab, 1) / family.training_flops_per_token(base, vocab, 1)
    print(f"model: hidden {args.hidden}, layers {args.layers}, seq {args.seq}, vocab {vocab}, "
          f"micro batch {args.micro_batch}, MTP D=1, device {plat.device}, threads {torch.get_num_threads()}")
    print(f"step time full: {times['full'] * 1e3:.1f} ms   MTP only: {times['mtp_only'] * 1e3:.1f} ms "
          f"(medians of {args.rounds} rounds)")
    print(f"measured ratio MTP only / full: {measured:.3f}")
    print(f"FLOPs-predicted ratio:          {predicted:.3f}")
    print(f"measured / predicted:           {measured / predicted:.3f} (target within 0.90-1.10)")
    destroy()


if __name__ == "__main__":
    main()
