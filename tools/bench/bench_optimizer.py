"""Optimizer step on the CPU: the implementations the platform layer can choose, side by side.

1. Raw Adam steps on the same --params fp32 parameters (20M by default, in 20 tensors): torch's
   default AdamW (foreach, what megatron-core used on CPU), torch's fused AdamW (what the platform
   layer now selects) and DeepSpeed's CPUAdam (optimizer.cpu_optimizer=deepspeed, if installed).
2. megatron-core's full optimizer step (distributed optimizer, grad copy, clipping, Adam) on the
   benchmark model in one process, with the default and the fused torch AdamW.
Rounds alternate the order; medians are printed with ratios to the foreach baseline.

    .venv/bin/python tools/bench/bench_optimizer.py [--params 20000000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
ARGS = dict(lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _raw_variants(total: int) -> dict:
    from megatron_mtp.platform.optimizers import FusedCPUAdamW

    per = total // 20
    variants = {"foreach": lambda p: torch.optim.AdamW(p, **ARGS, foreach=True),
                "fused": lambda p: FusedCPUAdamW(p, **ARGS)}
    try:
        from megatron_mtp.platform.deepspeed_adam import DeepSpeedCPUAdamW

        variants["deepspeed"] = lambda p: DeepSpeedCPUAdamW(p, **ARGS)
    except ImportError:
        print("DeepSpeed is not installed: CPUAdam left out (pip install 'megatron-mtp[deepspeed]')")
    built = {}
    for name, make in variants.items():
        params = [torch.nn.Parameter(torch.randn(per)) for _ in range(20)]
        for p in params:
            p.grad = torch.randn(per)
        opt = make(params)
        opt.step()  # state allocation and DeepSpeed's kernel build are not timed
        built[name] = opt.step
    return built


def _median_times(fns: dict, rounds: int, steps: int) -> dict:
    times = {name: [] for name in fns}
    for r in range(rounds):
        order = list(fns.items())
        for name, fn in order if r % 2 == 0 else reversed(order):
            start = time.perf_counter()
            for _ in range(steps):
                fn()
            times[name].append((time.perf_counter() - start) / steps)
    return {name: statistics.median(v) for name, v in times.items()}


def _megatron_variants(args) -> dict:
    from _train_bench import single_process_setup

    from megatron_mtp.platform.optimizers import use_fused_torch_adam
    from megatron_mtp.training.components import build_components

    cfg, platform, vocab = single_process_setup(args)
    built = {}
    for name in ("foreach", "fused"):
        torch.manual_seed(0)
        components = build_components(cfg, platform, vocab)
        if name == "foreach":  # undo the platform's choice: megatron-core's default torch AdamW
            for inner in components.optimizer.chained_optimizers:
                for group in inner.optimizer.param_groups:
                    group["fused"], group["foreach"] = False, True
        else:
            use_fused_torch_adam(components.optimizer, platform)
        for chunk in components.model:
            for p in chunk.parameters():
                p.main_grad.normal_()
        components.optimizer.step()
        built[name] = components.optimizer.step
    return built


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from _train_bench import model_arguments

    model_arguments(ap)
    ap.add_argument("--params", type=int, default=20_000_000)
    args = ap.parse_args()
    print(f"threads {torch.get_num_threads()}, raw parameters {args.params / 1e6:.0f}M fp32")
    raw = _median_times(_raw_variants(args.params), args.rounds, 3)
    for name, seconds in raw.items():
        print(f"  raw {name:10s} {seconds * 1e3:7.1f} ms   foreach / this: {raw['foreach'] / seconds:.2f}")
    full = _median_times(_megatron_variants(args), args.rounds, 2)
    print(f"megatron-core optimizer step, hidden {args.hidden}, {args.layers} layers:")
    for name, seconds in full.items():
        print(f"  {name:10s} {seconds * 1e3:7.1f} ms   foreach / this: {full['foreach'] / seconds:.2f}")


if __name__ == "__main__":
    main()
