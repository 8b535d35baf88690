"""MTP overhead: training step time with MTP depth D=1 over D=0 on the same model, beside the
ratio predicted from FLOPs (models/deepseek_v3/sizes.py). Target: within 3% of predicted.

    .venv/bin/python tools/bench/bench_mtp_overhead.py [--hidden 512 --layers 4 --seq 512 ...]

The default size keeps matmuls dominant; at hidden 256 / seq 256 on CPU, MoE dispatch and other
non-matmul work make the main model relatively dearer and the measured ratio falls below FLOPs.

One process (CPU/gloo or one GPU); both models are built in the same process and timed in
alternating blocks through the real trainer step.
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

    from megatron_mtp.models.deepseek_v3.sizes import training_flops_per_token
    from megatron_mtp.training.distributed import destroy

    base, plat, vocab = single_process_setup(args)
    data_set = RandomTokens(vocab, args.seq)
    steps, predicted = {}, {}
    run_dir = scratch_dir("bench_mtp_")
    for depth in (0, 1):
        cfg = base.replace(mtp=dataclasses.replace(base.mtp, num_layers=depth))
        _, steps[f"D={depth}"] = trainer_step(cfg, plat, vocab, data_set, run_dir / f"d{depth}")
        predicted[depth] = training_flops_per_token(cfg, vocab, depth)
    times = interleaved(steps, rounds=args.rounds, steps_per_round=args.steps_per_round)
    measured = times["D=1"] / times["D=0"]
    pred = predicted[1] / predicted[0]
    print(f"model: hidden {args.hidden}, layers {args.layers}, seq {args.seq}, vocab {vocab}, "
          f"micro batch {args.micro_batch}, device {plat.device}, threads {torch.get_num_threads()}")
    print(f"step time D=0: {times['D=0'] * 1e3:.1f} ms   D=1: {times['D=1'] * 1e3:.1f} ms "
          f"(medians of {args.rounds} rounds)")
    print(f"measured ratio D=1/D=0: {measured:.3f}")
    print(f"FLOPs-predicted ratio:  {pred:.3f}")
    print(f"measured / predicted:   {measured / pred:.3f} (target within 0.97-1.03)")
    destroy()


if __name__ == "__main__":
    main()
