"""Parallel layout: tensor, pipeline (and virtual), expert parallel sizes, and communication overlap.

Data parallelism is what is left: world / (tensor × pipeline × context) for attention and dense layers, and
world / (expert_tensor × expert × pipeline) for the routed experts (megatron-core's parallel
folding: experts reuse the same ranks with their own grouping).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional, Union

Toggle = Union[bool, Literal["auto"]]
"""true, false, or auto: on where the platform has what it needs (GPU, Transformer Engine, ...)."""


@dataclass
class ParallelConfig:
    tensor: int = 1
    """Tensor-parallel size (TP)."""
    pipeline: int = 1
    """Pipeline-parallel stages (PP); MTP layers always live on the last stage."""
    virtual_pipeline: Optional[int] = None
    """Model chunks per pipeline rank for the interleaved schedule (VPP; null or 1: not interleaved).
    Implied by a pipeline_layout with pipeline × N stages."""
    context: int = 1
    """Context-parallel size (CP): each sequence split over this many ranks, in 2 × CP chunks (rank r holds
    chunks r and 2CP - 1 - r, which balances causal attention), keys and values passed around a ring
    (megatron-core's context_parallel_size: Transformer Engine's attention on GPUs, an all-gather of keys
    and values in the local attention; models/context_parallel.py). Not yet with parallel MTP heads,
    mtp.freeze_base, data.reset_attention_mask, or data.eod_mask_loss with MTP layers."""
    expert: int = 1
    """Expert-parallel size (EP): routed experts are split across this many ranks."""
    expert_tensor: Optional[int] = None
    """Tensor-parallel size inside each routed expert (expert TP; null: same as tensor). DeepSeek-V3
    recipes use tensor=2 with expert_tensor=1."""
    sequence_parallel: Optional[bool] = None
    """Sequence parallelism along TP (null: on whenever tensor > 1; MoE with TP needs it)."""
    world_size: Optional[int] = None
    """Expected number of processes; null accepts whatever the launcher starts."""
    token_dispatcher: Literal["alltoall", "allgather", "flex"] = "alltoall"
    """MoE token dispatcher; flex uses DeepEP or HybridEP (GPU, installed separately; see flex_backend)."""
    flex_backend: Literal["deepep", "hybridep"] = "deepep"
    """Communication library of the flex dispatcher."""
    pipeline_layout: Optional[Union[list[int], str]] = None
    """How layers are placed on pipeline stages (null: an even split, MTP on the last stage). Either
    decoder layers per stage ([4, 4, 3, 1]; with virtual_pipeline, pipeline × VPP entries in
    megatron-core's stage order: stage i runs on pipeline rank i % pipeline) with MTP and the loss
    after the last stage's layers, or a megatron-core layout string: E embedding, t decoder layer,
    m MTP layer, L loss, | stage boundary, (..)*n repetition (DeepSeek-V3 PP8 × VPP4:
    "Et|(tt|)*30mL")."""
    distributed_optimizer: bool = True
    """Shard optimizer state over data-parallel ranks (ZeRO-1, megatron-core DistributedOptimizer)."""
    backend: Literal["auto", "nccl", "gloo"] = "auto"
    """torch.distributed backend; auto picks nccl on GPUs and gloo on CPU."""
    overlap_grad_reduce: bool = False
    """Overlap the data-parallel gradient reduce-scatter/all-reduce with the backward pass (buckets)."""
    overlap_param_gather: bool = False
    """Overlap the distributed optimizer's parameter all-gather with the next forward (needs
    distributed_optimizer and overlap_grad_reduce)."""
    bucket_size: Optional[int] = None
    """Gradient bucket size in elements for the overlapped reduce (null: megatron-core's default,
    max(40M, 1M × data-parallel size))."""
    tp_comm_overlap: Toggle = False
    """Overlap tensor-parallel communication with GEMMs (Transformer Engine userbuffers, GPU)."""
    shared_expert_overlap: Toggle = "auto"
    """Run the shared experts while the routed tokens travel (megatron-core's moe_shared_expert_overlap: CUDA
    streams, GPU only). auto: on with a GPU, shared experts and the alltoall dispatcher, unless
    moe_a2a_overlap (which overlaps them itself) or recomputation of the shared experts is on."""
    moe_a2a_overlap: bool = False
    """Overlap the expert-parallel all-to-all of one micro-batch with the compute of another
    (megatron-core's overlap_moe_expert_parallel_comm: bf16, expert > 1, and with MTP pipeline > 1
    with virtual_pipeline)."""
    delay_wgrad_compute: bool = False
    """With moe_a2a_overlap: compute weight gradients later to widen the overlap (Transformer Engine)."""
