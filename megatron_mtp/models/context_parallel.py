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
values (``over_context``; models/mtp_objective.py; the depths' labels are rolled across ranks by megatron-core's
``roll_tensor``). The acceptance metric rolls the main model's argmax
and the labels across the ranks the same way (training/metrics.py), so it judges what one process does.
"""

from __future__ import annotations

import torch

from megatron_mtp.platform.context_chunks import chunk_order


def local_batch(batch: dict, rank: int, cp: int) -> dict:
    """This CP rank's part of every [b, s] tensor of ``batch``: its two chunks (``chunk_order``)."""
    if cp == 1:
        return batch
    first, second = chunk_order(rank, cp)
    out = {}
    for key, value in batch.items():
        if torch.is_tensor(value) and value.dim() >= 2:
            chunks = value.chunk(2 * cp, dim=1)
            value = torch.cat([chunks[first], chunks[second]], dim=1)
        out[key] = value
    return out


def over_context(count: torch.Tensor, total: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor]:
    """A micro-batch's token count and loss sum over the CP ranks, in one all-reduce and without gradient
    (``group`` None: as they are)."""
    if group is None or torch.distributed.get_world_size(group) == 1:
        return count, total
    both = torch.stack([count.detach().float(), total.detach().float()])
    torch.distributed.all_reduce(both, group=group)
    return both[0], both[1]
