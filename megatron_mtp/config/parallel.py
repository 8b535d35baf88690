"""Parallel layout: tensor, pipeline, expert parallel sizes (data parallel is what is left)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass
class ParallelConfig:
    tensor: int = 1
    """Tensor-parallel size (TP)."""
    pipeline: int = 1
    """Pipeline-parallel stages (PP); MTP layers always live on the last stage."""
    expert: int = 1
    """Expert-parallel size (EP): routed experts are split across this many ranks."""
    sequence_parallel: Optional[bool] = None
    """Sequence parallelism along TP (null: on whenever tensor > 1; MoE with TP needs it)."""
    world_size: Optional[int] = None
    """Expected number of processes; null accepts whatever the launcher starts."""
    token_dispatcher: Literal["alltoall", "allgather"] = "alltoall"
    """MoE token dispatcher."""
    pipeline_layout: Optional[list[int]] = None
    """Main-model decoder layers per pipeline stage (null: even split). MTP layers are not counted
    here; they always run after the last stage's layers."""
    distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (ZeRO-1, megatron-core DistributedOptimizer)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto picks nccl on GPUs and gloo on CPU."""
