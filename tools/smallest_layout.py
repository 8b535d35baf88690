"""The smallest GPU count, and the layout at it, that `plan` says fits a config on a GPU kind.

    .venv/bin/python tools/smallest_layout.py configs/glm4_5.yaml --gpu h100 [key.path=value ...]

Searches world sizes of whole nodes (8 GPUs each by default) from one node up, one node at a time,
and at each the layouts TP in {1,2,4,8} x PP in {1,2,4,...,32} x EP in {1,2,4,...,64} (expert TP 1,
virtual pipeline off, an even layer split: `parallel.pipeline_layout=null`) that the config's own
checks accept. Prints, for the first world size with a fitting layout, every fitting layout by
worst-rank memory, and the command that reproduces the best one. The plan is the one `megatron-mtp
plan` prints (exact state bytes; saved activations and workspace estimated as it states). Runs in
seconds per layout, no process group.
"""

from __future__ import annotations

import argparse
import itertools
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (e.g. mtp.freeze_base=true)")
    ap.add_argument("--gpu", default="h100", help="h100, h200, b200 or GiB")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=128)
    args = ap.parse_intermixed_args()

    from megatron_mtp.config import load_config
    from megatron_mtp.config.validate import validate
    from megatron_mtp.errors import UserError
    from megatron_mtp.plan.gpus import parse_gpu
    from megatron_mtp.plan.memory import make_plan

    try:
        gpu = parse_gpu(args.gpu)
        validate(load_config(args.config, list(args.overrides)))  # the user's own mistakes, before any layout
    except UserError as exc:
        print(f"smallest_layout: error: {exc}", file=sys.stderr)
        return 2
    nodes = 1
    while nodes <= args.max_nodes:
        world = nodes * args.gpus_per_node
        fits = []
        for tp, pp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32), (1, 2, 4, 8, 16, 32, 64)):
            if world % (tp * pp) or world % (pp * ep):
                continue
            layout = [f"parallel.tensor={tp}", f"parallel.pipeline={pp}", f"parallel.expert={ep}",
                      "parallel.expert_tensor=1", "parallel.virtual_pipeline=null", "parallel.pipeline_layout=null",
                      f"parallel.world_size={world}"]
            try:
                cfg = load_config(args.config, [*args.overrides, *layout])
                validate(cfg)
                plan = make_plan(cfg, world, gpu, cpu=False, imbalance=1.0)
            except UserError:
                continue  # a layout the config can't take (heads, experts or layers don't divide)
            if plan.fits:
                fits.append((plan.worst.total, tp, pp, ep, plan.worst.pp_rank))
        if fits:
            fits.sort()
            print(f"{args.config} on {gpu.name} ({gpu.memory_bytes / 2**30:.1f} GiB): smallest fitting world "
                  f"{world} GPUs ({nodes} node(s) x {args.gpus_per_node})")
            for total, tp, pp, ep, rank in fits:
                print(f"  TP{tp} x PP{pp} x EP{ep} x DP{world // (tp * pp)}: worst rank {total / 2**30:.1f} GiB "
                      f"(pipeline rank {rank})")
            _, tp, pp, ep, _ = fits[0]
            print("reproduce: megatron-mtp plan " + " ".join([
                args.config, *args.overrides, f"parallel.tensor={tp}", f"parallel.pipeline={pp}",
                f"parallel.expert={ep}", "parallel.expert_tensor=1", "parallel.virtual_pipeline=null",
                "parallel.pipeline_layout=null", f"parallel.world_size={world}", f"--nodes {nodes}",
                f"--gpus-per-node {args.gpus_per_node}",
                f"--gpu {args.gpu}"]))
            return 0
        nodes += 1
    print(f"no layout up to {args.max_nodes} nodes fits {args.config} on {gpu.name}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
