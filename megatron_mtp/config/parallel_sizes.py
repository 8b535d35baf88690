"""The parallel sizes of a run: what megatron-core's initialize_model_parallel will build.

One function serves validation, training and `plan`. Dense layers (attention, dense MLPs,
embedding, head) are replicated over dp = world / (TP × PP × CP) ranks (CP: context parallelism, a
sequence split over CP ranks of one replica); routed experts are split over
EP ranks with expert tensor parallelism ETP and replicated over edp = world / (ETP × EP × PP)
("parallel folding": the expert grid reuses the same ranks with its own grouping, so EP need not
divide dp; DeepSeek-V3 recipes run TP2 × ETP1 × EP64 × PP16 on 1,024 GPUs).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from megatron_mtp.config.root import Config
from megatron_mtp.errors import UserError


@dataclass(frozen=True)
class ParallelSizes:
    world: int
    tp: int
    pp: int
    vpp: int
    """Model chunks per pipeline rank (1: not interleaved)."""
    ep: int
    etp: int
    dp: int
    """Data-parallel replicas of the dense parameters."""
    edp: int
    """Data-parallel replicas of the routed experts."""
    cp: int = 1
    """Context-parallel ranks that share one sequence."""

    @property
    def sequence_parallel(self) -> bool:
        return self.tp > 1


def minimal_world(cfg: Config) -> int:
    """The smallest world both grids fit: lcm(TP × PP × CP, ETP × EP × PP)."""
    p = cfg.parallel
    return math.lcm(p.tensor * p.pipeline * p.context, (p.expert_tensor or p.tensor) * p.expert * p.pipeline)


def parallel_sizes(cfg: Config, world: int | None = None, vpp: int = 1) -> ParallelSizes:
    """Sizes for `world` processes (default: parallel.world_size, else the minimal world)."""
    p = cfg.parallel
    world = world or p.world_size or minimal_world(cfg)
    etp = p.expert_tensor or p.tensor
    dense, expert = p.tensor * p.pipeline * p.context, etp * p.expert * p.pipeline
    if world % dense:
        what = "parallel.tensor × parallel.pipeline" + (" × parallel.context" if p.context > 1 else "")
        sizes = f"{p.tensor}×{p.pipeline}" + (f"×{p.context}" if p.context > 1 else "")
        raise UserError(f"world size {world} is not divisible by {what} = {sizes}; change the parallel sizes or the "
                        "number of processes")
    if world % expert:
        raise UserError(f"world size {world} is not divisible by expert tensor × expert × pipeline = "
                        f"{etp}×{p.expert}×{p.pipeline} (the routed experts' grid); change parallel.expert, "
                        "parallel.expert_tensor or the number of processes")
    return ParallelSizes(world=world, tp=p.tensor, pp=p.pipeline, vpp=vpp, ep=p.expert, etp=etp,
                         dp=world // dense, edp=world // expert, cp=p.context)
