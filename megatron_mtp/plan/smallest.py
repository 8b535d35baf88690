"""`megatron-mtp plan CONFIG --smallest`: the fewest whole nodes, and the layouts there, that the plan
says fit a config on a GPU kind.

Searches world sizes of whole nodes (--gpus-per-node each, 8 by default) from one node up, and at each
the layouts TP in {1,2,4,8} x PP in {1,2,4,...,32} x EP in {1,2,4,...,64} (expert TP 1, virtual
pipeline off; megatron-core's even layer split, `parallel.pipeline_layout=null`, and with MTP layers
also the decoder layers over PP - 1 stages with the MTP layers and the loss on a last stage of their
own, which lightens the stage that holds the output layer; for sequences of 16K tokens or more also CP
in {1,2,...,32}) that the config's own checks accept.
Prints, for the first world size with a fitting layout, every fitting layout by worst-rank memory,
and the `plan` command that reproduces the best one. The plan is the one `megatron-mtp plan`
prints (exact state bytes; saved activations and workspace estimated as it states). It plans the
most sharded layouts at the most GPUs (--max-nodes) first and stops there when some pass the
config's checks and none fits even then;
each node count it plans is one progress line on stderr. A tenth of a second or less per layout, no
process group.
"""

from __future__ import annotations

import itertools
import sys

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.plan.gpus import parse_gpu
from megatron_mtp.plan.memory import make_plan

LONG = 16384
"""From this sequence length on, the search also splits sequences over context-parallel ranks."""


def _contexts(cfg) -> tuple[int, ...]:
    """The context-parallel sizes tried: 1, and for sequences of LONG tokens or more 2 to 32."""
    return (1, 2, 4, 8, 16, 32) if cfg.training.seq_length >= LONG else (1,)


def _cp(cp: int) -> str:
    return f" x CP{cp}" if cp > 1 else ""


def _splits(cfg, pp: int) -> list[str]:
    """The pipeline layouts tried at ``pp`` stages: megatron-core's even split (MTP beside the last decoder
    layers) and, with MTP layers, the decoder layers split evenly over pp - 1 stages and the MTP layers
    with the loss on a last stage of their own."""
    out = ["null"]
    layers, mtp = cfg.model.num_layers, cfg.mtp.num_layers
    if pp > 1 and mtp and layers % (pp - 1) == 0:
        out.append("[" + ",".join([str(layers // (pp - 1))] * (pp - 1) + ["0"]) + "]")
    return out


def smallest(config: str, overrides: list[str], gpu_name: str = "h100", gpus_per_node: int = 8,
             max_nodes: int = 128) -> int:
    """Print the search's result; 0 when a layout fits, 1 when none does up to ``max_nodes``."""
    if gpus_per_node < 1 or max_nodes < 1:
        raise UserError(f"--gpus-per-node ({gpus_per_node}) and --max-nodes ({max_nodes}) must be at least 1")
    gpu = parse_gpu(gpu_name)
    base = load_config(config, list(overrides))
    validate(base)  # the user's own mistakes, before any layout
    overrides = list(overrides)

    def plans(nodes: int, most_sharded: int | None = None) -> list[tuple]:
        """(worst-rank bytes, fits, tp, pp, ep, worst pipeline rank) of every layout the config takes (or
        of the ``most_sharded`` ones with the largest TP x PP x EP)."""
        world = nodes * gpus_per_node
        out = []
        combos = [(tp, pp, ep, cp) for tp, pp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32),
                                                                         (1, 2, 4, 8, 16, 32, 64))
                  for cp in _contexts(base)
                  if not (world % (tp * pp * cp) or world % (pp * ep))]
        if most_sharded is not None:
            combos.sort(key=lambda c: -c[0] * c[1] * c[2] * c[3])
        for tp, pp, ep, cp in combos:
            if most_sharded is not None and len(out) == most_sharded:
                break
            for split in _splits(base, pp):
                layout = [f"parallel.tensor={tp}", f"parallel.pipeline={pp}", f"parallel.expert={ep}",
                          f"parallel.context={cp}", "parallel.expert_tensor=1", "parallel.virtual_pipeline=null",
                          f"parallel.pipeline_layout={split}", f"parallel.world_size={world}"]
                try:
                    cfg = load_config(config, [*overrides, *layout])
                    validate(cfg)
                    plan = make_plan(cfg, world, gpu, cpu=False, imbalance=1.0)
                except UserError:
                    continue  # a layout the config can't take (heads, experts or layers don't divide)
                out.append((plan.worst.total, plan.fits, tp, pp, ep, plan.worst.pp_rank, split, cp))
        best = min(out, default=None)
        which = "most sharded " if most_sharded is not None else ""
        print(f"  {nodes} node(s), {world} GPUs: {len(out)} {which}layouts planned, {sum(o[1] for o in out)} fit"
              + (f"; lowest worst rank {best[0] / 2**30:.1f} GiB" if best else ""), file=sys.stderr, flush=True)
        return out

    gib = gpu.memory_bytes / 2**30
    print(f"plan --smallest: {config} on {gpu.name} ({gib:.1f} GiB), whole nodes of {gpus_per_node} "
          f"GPUs; first the most sharded layouts at {max_nodes} nodes, then from one node up", file=sys.stderr,
          flush=True)
    # if the most sharded layouts at the most nodes do not fit, no smaller world will; but where the
    # config's checks take no layout there (the batch must divide over more data-parallel ranks as the
    # world grows), that says nothing of smaller worlds, which are searched as usual
    largest = plans(max_nodes, most_sharded=4)
    if largest and not any(fits for _, fits, *_ in largest):
        total, _, tp, pp, ep, _, _, cp = min(largest)
        print(f"no layout up to {max_nodes} nodes fits {config} on {gpu.name}: even at "
              f"{max_nodes * gpus_per_node} GPUs the lowest worst rank is {total / 2**30:.1f} GiB "
              f"(TP{tp} x PP{pp} x EP{ep}{_cp(cp)}) of {gib:.1f} GiB", file=sys.stderr)
        return 1
    for nodes in range(1, max_nodes + 1):
        world = nodes * gpus_per_node
        fits = sorted((total, tp, pp, ep, rank, split, cp) for total, ok, tp, pp, ep, rank, split, cp in plans(nodes)
                      if ok)
        if not fits:
            continue
        print(f"{config} on {gpu.name} ({gib:.1f} GiB): smallest fitting world "
              f"{world} GPUs ({nodes} node(s) x {gpus_per_node})")
        for total, tp, pp, ep, rank, split, cp in fits:
            print(f"  TP{tp} x PP{pp} x EP{ep}{_cp(cp)} x DP{world // (tp * pp * cp)}"
                  + (" (MTP on a stage of its own)" if split != "null" else "")
                  + f": worst rank {total / 2**30:.1f} GiB (pipeline rank {rank})")
        _, tp, pp, ep, _, split, cp = fits[0]
        print("reproduce: megatron-mtp plan " + " ".join([
            config, *overrides, f"parallel.tensor={tp}", f"parallel.pipeline={pp}",
            f"parallel.expert={ep}", f"parallel.context={cp}", "parallel.expert_tensor=1",
            "parallel.virtual_pipeline=null", f"parallel.pipeline_layout={split}", f"parallel.world_size={world}",
            f"--nodes {nodes}",
            f"--gpus-per-node {gpus_per_node}",
            f"--gpu {gpu_name}"]))
        return 0
    print(f"no layout of TP x PP x EP up to {max_nodes} nodes of {gpus_per_node} GPUs both passes {config}'s own "
          f"checks and fits on {gpu.name}; raise --max-nodes or change the batch or model sizes", file=sys.stderr)
    return 1
