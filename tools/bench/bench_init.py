"""Start-up cost of layout-invariant initialisation (models/initialization.py) for a large config.

Draws, on this CPU, what one rank of CONFIG (default: the 671B config at its layout) draws for one
MoE layer: every tensor it holds a slice of in full (TP-split ones whole), one whole tensor per
local expert, each from its own generator; beside it, what megatron-core's own initialisation draws
for that rank (the local shards only, from one generator). Rounds alternate the order; medians and
the ratio are printed, with the estimate for the rank's layers and the embedding / output layer.
On a GPU megatron-core draws its shards on the device (milliseconds), so the CPU time of the
layout-invariant draw is what start-up gains.

    .venv/bin/python tools/bench/bench_init.py [CONFIG] [--rounds 3] [--threads N]
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _draw(numels: list[int], own_generators: bool) -> float:
    gen = None if own_generators else torch.Generator().manual_seed(0)
    start = time.perf_counter()
    for i, n in enumerate(numels):
        if own_generators:
            gen = torch.Generator().manual_seed(i)
        torch.empty(n).normal_(0.0, 0.006, generator=gen)
    return time.perf_counter() - start


def main() -> None:
    from megatron_mtp.config import load_config
    from megatron_mtp.config.parallel_sizes import parallel_sizes
    from megatron_mtp.plan.params import _layer

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config", nargs="?", default=str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    cfg = load_config(args.config)
    sizes = parallel_sizes(cfg)
    whole = dataclasses.replace(sizes, tp=1, etp=1)  # what is drawn: whole tensors, the local experts
    local = [p.numel for p in _layer(cfg, sizes, "", moe=True, te=True) if "norm" not in p.name]
    drawn = [p.numel for p in _layer(cfg, whole, "", moe=True, te=True) if "norm" not in p.name]
    times = {"megatron-core (local shards)": [], "layout-invariant (whole tensors)": []}
    for r in range(args.rounds):
        order = list(times) if r % 2 == 0 else list(reversed(times))
        for name in order:
            times[name].append(_draw(local if name.startswith("megatron") else drawn, name.startswith("layout")))
    m = {k: statistics.median(v) for k, v in times.items()}
    base, ours = m["megatron-core (local shards)"], m["layout-invariant (whole tensors)"]
    layers = -(-(cfg.model.num_layers + cfg.mtp.num_layers) // (sizes.pp * (cfg.parallel.virtual_pipeline or 1)))
    layers *= cfg.parallel.virtual_pipeline or 1
    vocab = cfg.model.vocab_size * cfg.model.hidden_size
    emb = _draw([vocab], True)
    print(f"{args.config}: TP{sizes.tp} PP{sizes.pp} EP{sizes.ep} ETP{sizes.etp}, {args.threads} threads, "
          f"median of {args.rounds}")
    print(f"  one MoE layer, one rank: megatron-core draws {sum(local) / 1e6:.0f}M elements in {base:.2f} s; "
          f"layout-invariant draws {sum(drawn) / 1e6:.0f}M in {ours:.2f} s ({ours / base:.2f}x)")
    print(f"  embedding or output layer (whole, first / last stage): {vocab / 1e6:.0f}M in {emb:.2f} s")
    print(f"  a rank with up to {layers} MoE layers: ~{layers * ours + emb:.0f} s of CPU at start-up "
          f"(megatron-core on the GPU: well under a second)")


if __name__ == "__main__":
    main()
