"""`megatron-mtp plan CONFIG --smallest`: the fewest whole nodes, and the layouts there, that the plan
says fit a config on a GPU kind.

Searches world sizes of whole nodes (--gpus-per-node each, 8 by default) from one node up, and at each
the layouts TP in {1,2,4,8} x PP in {1,2,4,...,32} x EP in {1,2,4,...,64} (expert TP 1, virtual
pipeline off; for sequences of 16K tokens or more also CP in {1,2,...,32}) that the config's own
checks accept. Pipeline splits tried (`_splits`): megatron-core's even split where the layer count
divides, else decoder layers as even as they go with the one-layer-fewer stages at both ends (the
embedding's and the output layer's); and with MTP layers also the decoder layers over PP - 1 stages with
the MTP layers and the loss on a last stage of their own, which lightens the stage that holds the output
layer.
The config's MoE all-to-all overlap (parallel.moe_a2a_overlap) needs a virtual pipeline once PP > 1,
which the search does not try: a layout its rule refuses is planned with the overlap (and
delay_wgrad_compute) off, marked so, and the reproduce command says it.
Prints, for the first world size with a fitting layout, every fitting layout by worst-rank memory,
and the `plan` command that reproduces the best one. The plan is the one `megatron-mtp plan`
prints (exact state bytes; saved activations and workspace estimated as it states).

Pruning: at each world size it plans the most sharded layouts (largest TP x PP x EP x CP) first and
moves on when some pass the config's checks and none fits (a less sharded layout holds more state and
activations per GPU); at the most GPUs (--max-nodes) that ends the search. Each node count it plans
is one progress line on stderr; a few milliseconds per layout, no process group. When the config's
checks refuse every layout at every size, the closing line names the check that refused the most.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
import sys
from collections import Counter

from megatron_mtp.config import load_config
from megatron_mtp.config.root import Config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.plan.memory import make_plan
from megatron_mtp.platform.gpus import parse_gpu

LONG = 16384
"""From this sequence length on, the search also splits sequences over context-parallel ranks."""
PROBE = 4
"""Most sharded layouts planned first at each world size."""
OVERLAP_OFF = {"moe_a2a_overlap": False, "delay_wgrad_compute": False}


def _contexts(cfg) -> tuple[int, ...]:
    """The context-parallel sizes tried: 1, and for sequences of LONG tokens or more 2 to 32."""
    return (1, 2, 4, 8, 16, 32) if cfg.training.seq_length >= LONG else (1,)


def _cp(cp: int) -> str:
    return f" x CP{cp}" if cp > 1 else ""


def balanced(layers: int, stages: int) -> list[int]:
    """``layers`` over ``stages`` as even as they go; the extra layers go to the middle stages first, then
    the first, so the stages that also hold the embedding or the output layer are the lighter ones."""
    counts = [layers // stages] * stages
    order = list(range(1, stages - 1)) + [0, stages - 1] if stages > 2 else list(range(stages))
    for i in order[:layers % stages]:
        counts[i] += 1
    return counts


def _text(value) -> str:
    """A parallel field's value as a command-line override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return "[" + ",".join(map(str, value)) + "]" if isinstance(value, list) else str(value)


def _overrides(fields: dict) -> list[str]:
    return [f"parallel.{k}={_text(v)}" for k, v in fields.items()]


def _splits(cfg, pp: int) -> list[list[int] | None]:
    """The pipeline layouts tried at ``pp`` stages (see the module note); None: megatron-core's even split."""
    layers, mtp = cfg.model.num_layers, cfg.mtp.num_layers
    out: list[list[int] | None] = [None if layers % pp == 0 else balanced(layers, pp)]
    if pp > 1 and mtp and layers >= pp - 1:
        out.append(balanced(layers, pp - 1) + [0])
    return out


def _reason(message: str) -> str:
    """A refusal with its numbers blanked, so the same check on different sizes counts once."""
    return re.sub(r"\d+", "N", message)


def smallest(config: str, overrides: list[str], gpu_name: str = "h100", gpus_per_node: int = 8,
             max_nodes: int = 128) -> int:
    """Print the search's result; 0 when a layout fits, 1 when none does up to ``max_nodes``."""
    if gpus_per_node < 1 or max_nodes < 1:
        raise UserError(f"--gpus-per-node ({gpus_per_node}) and --max-nodes ({max_nodes}) must be at least 1")
    gpu = parse_gpu(gpu_name)
    base = load_config(config, list(overrides))
    validate(base)  # the user's own mistakes, before any layout
    overrides = list(overrides)
    overlap = base.parallel.moe_a2a_overlap
    refusals: Counter[str] = Counter()
    examples: dict[str, str] = {}

    def refused(exc: UserError) -> None:
        refusals[_reason(str(exc))] += 1
        examples.setdefault(_reason(str(exc)), str(exc))

    def checked(fields: dict) -> tuple[Config | None, str]:
        """(the config with these parallel fields, "") if its checks pass, else (None, the refusal), counted.
        The fields replace the loaded config's (no copy of the rest: validation and the plan only read it)."""
        cfg = dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, **fields))
        try:
            validate(cfg)
            return cfg, ""
        except UserError as exc:
            refused(exc)
            return None, str(exc)

    def plan_one(tp, pp, ep, cp, split, world):
        fields = {"tensor": tp, "pipeline": pp, "expert": ep, "context": cp, "expert_tensor": 1,
                  "virtual_pipeline": None, "pipeline_layout": split, "world_size": world}
        cfg, off = checked(fields)  # off: the overlap's refusal where the layout is planned without it
        if cfg is None and overlap:
            cfg, _ = checked({**fields, **OVERLAP_OFF})
        if cfg is None:
            return None
        try:
            plan = make_plan(cfg, world, gpu, cpu=False, imbalance=1.0)
        except UserError as exc:
            refused(exc)
            return None
        return (plan.worst.total, plan.fits, tp, pp, ep, plan.worst.pp_rank, split, cp, off)

    def plans(nodes: int, probe: bool = False) -> list[tuple]:
        """The plan tuples of every layout the config takes at ``nodes`` (the PROBE most sharded ones
        first; only those when ``probe`` or when they were planned and none fits)."""
        world = nodes * gpus_per_node
        combos = [(tp, pp, ep, cp) for tp, pp, ep in itertools.product((1, 2, 4, 8), (1, 2, 4, 8, 16, 32),
                                                                         (1, 2, 4, 8, 16, 32, 64))
                  for cp in _contexts(base)
                  if not (world % (tp * pp * cp) or world % (pp * ep))]
        combos.sort(key=lambda c: -c[0] * c[1] * c[2] * c[3])
        out: list[tuple] = []
        done = len(combos)
        for i, (tp, pp, ep, cp) in enumerate(combos):
            if len(out) >= PROBE and (probe or not any(o[1] for o in out)):
                done = i
                break
            for split in _splits(base, pp):
                result = plan_one(tp, pp, ep, cp, split, world)
                if result is not None:
                    out.append(result)
        best = min(out, default=None, key=lambda o: o[0])
        which = "most sharded " if probe or done < len(combos) else ""
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
    largest = plans(max_nodes, probe=True)
    if largest and not any(o[1] for o in largest):
        total, _, tp, pp, ep, _, _, cp, _ = min(largest, key=lambda o: o[0])
        print(f"no layout up to {max_nodes} nodes fits {config} on {gpu.name}: even at "
              f"{max_nodes * gpus_per_node} GPUs the lowest worst rank is {total / 2**30:.1f} GiB "
              f"(TP{tp} x PP{pp} x EP{ep}{_cp(cp)}) of {gib:.1f} GiB", file=sys.stderr)
        return 1
    planned = len(largest)
    for nodes in range(1, max_nodes + 1):
        world = nodes * gpus_per_node
        found = plans(nodes)
        planned += len(found)
        fits = sorted(((total, tp, pp, ep, rank, split, cp, off)
                       for total, ok, tp, pp, ep, rank, split, cp, off in found if ok), key=lambda f: f[:5])
        if not fits:
            continue
        print(f"{config} on {gpu.name} ({gib:.1f} GiB): smallest fitting world "
              f"{world} GPUs ({nodes} node(s) x {gpus_per_node})")
        for total, tp, pp, ep, rank, split, cp, off in fits:
            alone = split is not None and split[-1] == 0
            notes = [n for n, on in (("MTP on a stage of its own", alone),
                                     (f"layers {_text(split)}", split is not None and not alone),
                                     ("MoE all-to-all overlap off", off)) if on]
            print(f"  TP{tp} x PP{pp} x EP{ep}{_cp(cp)} x DP{world // (tp * pp * cp)}"
                  + (f" ({'; '.join(notes)})" if notes else "")
                  + f": worst rank {total / 2**30:.1f} GiB (pipeline rank {rank})")
        _, tp, pp, ep, _, split, cp, off = fits[0]
        if off:
            print(f"note: with the config's parallel.moe_a2a_overlap=true this layout is refused ({off}); the "
                  "search tries no virtual pipeline, so layouts marked 'MoE all-to-all overlap off' are planned "
                  "with the overlap and delay_wgrad_compute off")
        print("reproduce: megatron-mtp plan " + " ".join([
            config, *overrides, *_overrides({
                "tensor": tp, "pipeline": pp, "expert": ep, "context": cp, "expert_tensor": 1, "virtual_pipeline": None,
                "pipeline_layout": split, "world_size": world, **(OVERLAP_OFF if off else {})}),
            f"--nodes {nodes}",
            f"--gpus-per-node {gpus_per_node}",
            f"--gpu {gpu_name}"]))
        return 0
    if not planned and refusals:
        reason, count = refusals.most_common(1)[0]
        print(f"no layout of TP x PP x EP up to {max_nodes} nodes of {gpus_per_node} GPUs passes {config}'s own "
              f"checks: the one refusing the most ({count} of {sum(refusals.values())} layouts tried) says "
              f"\"{examples[reason]}\"; change what it names", file=sys.stderr)
        return 1
    print(f"no layout of TP x PP x EP up to {max_nodes} nodes of {gpus_per_node} GPUs both passes {config}'s own "
          f"checks and fits on {gpu.name}; raise --max-nodes or change the batch or model sizes", file=sys.stderr)
    return 1
