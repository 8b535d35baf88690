"""What context parallelism (parallel.context = CP) changes around the model.

Design note. A sequence of s tokens is cut into 2·CP chunks of c = s / (2·CP); CP rank r holds chunks r
and 2CP - 1 - r (megatron-core's load-balanced split: causal attention costs every rank alike), so its
micro-batch is [b, s / CP] (``local_batch``). Attention sees the whole sequence (Transformer Engine's
ring on GPUs, platform/local_modules.CoreAttention's all-gather on CPU) and RoPE the global positions
(megatron-core slices the rotary table per rank); everything position-wise runs on the local part.
The loss is a mean over the sequence's tokens, which the CP ranks hold between them. megatron-core's
DDP averages gradients over data × context ranks, and its schedule multiplies the main loss by CP to
undo the context part of that average (not the MTP losses, which enter through MTPLossAutoScaler), so
    main loss of a rank  = (Σ over its tokens) / (tokens of all CP ranks)
    depth k of a rank    = (λ/D) · (Σ over its tokens) · CP / (depth-k tokens of all CP ranks)
and each rank reports the micro-batch's whole sum and count, so the logged losses are the one-process
values (models/mtp_objective.py; the depths' labels are rolled across ranks by megatron-core's
``roll_tensor``). The acceptance metric rolls the main model's argmax
and the labels across the ranks the same way (training/metrics.py), so it judges what one process does.
"""

from __future__ import annotations

import torch


def local_batch(batch: dict, rank: int, cp: int) -> dict:
    """This CP rank's part of every [b, s] tensor of ``batch``: chunks rank and 2·cp - 1 - rank."""
    if cp == 1:
        return batch
    out = {}
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() >= 2:
            chunks = value.chunk(2 * cp, dim=1)
            value = torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=1)
        out[key] = value
    return out


def global_count(count: torch.Tensor, group) -> torch.Tensor:
    """``count`` summed over the CP ranks (no gradient; ``group`` None: as it is)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return count
    total = count.detach().clone()
    torch.distributed.all_reduce(total, group=group)
    return total
