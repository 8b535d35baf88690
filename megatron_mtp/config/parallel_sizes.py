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


def grid_refusal(cfg: Config, world: int) -> tuple[str, str] | None:
    """Why `world` processes fit no grid of cfg's parallel sizes, or None when they fit.

    The one rule every caller applies (validation, `plan`, `submit`): (what is wrong, phrased to follow
    "<world> processes", and the parallel fields that would change it); callers add their own advice for
    the process count (a launch, or submit's --nodes/--gpus-per-node).
    """
    p = cfg.parallel
    etp = p.expert_tensor or p.tensor
    dense, expert = p.tensor * p.pipeline * p.context, etp * p.expert * p.pipeline
    if world % dense:
        what = "tensor × pipeline" + (" × context" if p.context > 1 else "")
        sizes = f"{p.tensor}×{p.pipeline}" + (f"×{p.context}" if p.context > 1 else "")
        fields = "parallel.tensor/pipeline" + ("/context" if p.context > 1 else "")
        return f"is not a multiple of {what} = {sizes} = {dense}", fields
    if world % expert:
        return (f"is not a multiple of expert tensor × expert × pipeline = {etp}×{p.expert}×{p.pipeline} = {expert} "
                "(the routed experts' grid, folded over the same ranks)", "parallel.expert/expert_tensor")
    return None


def parallel_sizes(cfg: Config, world: int | None = None, vpp: int = 1) -> ParallelSizes:
    """Sizes for `world` processes (default: parallel.world_size, else the minimal world)."""
    p = cfg.parallel
    world = world or p.world_size or minimal_world(cfg)
    refusal = grid_refusal(cfg, world)
    if refusal:
        raise UserError(f"world size {world} {refusal[0]}; change {refusal[1]} or the number of processes")
    etp = p.expert_tensor or p.tensor
    dense, expert = p.tensor * p.pipeline * p.context, etp * p.expert * p.pipeline
    return ParallelSizes(world=world, tp=p.tensor, pp=p.pipeline, vpp=vpp, ep=p.expert, etp=etp,
                         dp=world // dense, edp=world // expert, cp=p.context)
