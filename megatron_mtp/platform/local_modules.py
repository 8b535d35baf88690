"""Local (non Transformer Engine) building blocks used by our specs when TE is absent.

- `RMSNorm`: RMSNorm (math in megatron_mtp/rms_norm.py) whose weight carries `sequence_parallel`
  like TE's norms, so that megatron-core's finalize_model_grads all-reduces its gradient over TP
  when sequence parallelism is on (megatron's WrappedTorchNorm refuses sequence parallelism).
- `CoreAttention`: causal scaled-dot-product attention that accepts MLA's separate key and value
  head dims (megatron's local DotProductAttention sizes its output by kv_channels only) and
  grouped-query attention's fewer key/value heads (each serves consecutive query heads, as in
  megatron-core's DotProductAttention and transformers' repeat_kv). With context parallelism
  (parallel.context, megatron-core's local attention has none) each rank gathers every rank's keys and
  values into the whole sequence and masks causally by global positions (models/context_parallel.py
  says which chunks a rank holds); Transformer Engine passes them around a ring instead. With
  megatron-core's ``window_size`` (left, 0) in its config a query sees only the ``left`` keys before
  it and itself (sliding-window attention, as TE's DotProductAttention reads the same field).
Both take megatron-core's constructor arguments, so specs can swap them for TE modules.
"""

from __future__ import annotations

import math
from typing import Optional

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.transformer_config import TransformerConfig
from torch import nn

from megatron_mtp.platform.context_chunks import chunk_order, local_positions
from megatron_mtp.rms_norm import rms_norm


class RMSNorm(nn.Module):
    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = 1e-6, **_):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=config.params_dtype))
        self.weight.sequence_parallel = bool(config.sequence_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        state_dict = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(state_dict, prefix, {}, sharded_offsets)


class CoreAttention(MegatronModule):
    """softmax(q kᵀ · scale + causal mask) v over [s, b, h, d] tensors (MLA- and GQA-aware)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: Optional[float] = None,
        softmax_scale: Optional[float] = None,
        k_channels: Optional[int] = None,
        v_channels: Optional[int] = None,
        cp_comm_type: str = "p2p",
        pg_collection=None,
        **_,
    ):
        super().__init__(config=config)
        k_channels = k_channels or config.kv_channels
        self.softmax_scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(k_channels)
        self.dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        window = getattr(config, "window_size", None)
        self.window = None if window is None or window[0] < 0 else int(window[0])

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None, **_):
        if self.window is not None and self.config.context_parallel_size == 1:
            return self._windowed(query, key, value, attention_mask)
        cp_mask = None
        if self.config.context_parallel_size > 1:
            from megatron.core import parallel_state

            group = parallel_state.get_context_parallel_group()
            key, value = (_WholeSequence.apply(t, group) for t in (key, value))
            cp_mask = _causal_by_position(query.shape[0], key.shape[0], group, query.device, self.window)
        # [s, b, h, d] -> [b, h, s, d]
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:  # grouped-query: key/value head g serves query heads g*r .. g*r+r-1
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        if cp_mask is not None:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=cp_mask, dropout_p=self.dropout if self.training else 0.0,
                scale=self.softmax_scale)
        elif attention_mask is not None:
            mask = ~attention_mask  # megatron: True = masked out; SDPA: True = attend
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0,
                scale=self.softmax_scale)
        else:
            out = torch.nn.functional.scaled_dot_product_attention(
                q, k, v, is_causal=q.shape[2] > 1, dropout_p=self.dropout if self.training else 0.0,
                scale=self.softmax_scale)
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)

    def _windowed(self, query, key, value, attention_mask):
        """Causal attention where query i sees keys i - window .. i (and, with ``attention_mask``, only
        those it leaves unmasked)."""
        q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))
        if k.shape[1] != q.shape[1]:
            repeat = q.shape[1] // k.shape[1]
            k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        pos_q = torch.arange(q.shape[2], device=q.device)[:, None]
        pos_k = torch.arange(k.shape[2], device=q.device)[None, :]
        mask = (pos_q >= pos_k) & (pos_q - pos_k <= self.window)
        if attention_mask is not None:
            mask = mask & ~attention_mask
        out = torch.nn.functional.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=self.dropout if self.training else 0.0, scale=self.softmax_scale)
        s, b = out.shape[2], out.shape[0]
        return out.permute(2, 0, 1, 3).reshape(s, b, -1)


class _WholeSequence(torch.autograd.Function):
    """[2c, ...] local chunks of every CP rank -> [2·CP·c, ...] in sequence order; the backward sums the
    whole-sequence gradient over the ranks (each rank's queries add their part) and keeps this rank's chunks."""

    @staticmethod
    def forward(ctx, local: torch.Tensor, group) -> torch.Tensor:
        cp, rank = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
        parts = [torch.empty_like(local) for _ in range(cp)]
        torch.distributed.all_gather(parts, local.contiguous(), group=group)
        chunks: list = [None] * (2 * cp)
        for r, part in enumerate(parts):
            first, second = part.chunk(2, dim=0)
            a, b = chunk_order(r, cp)
            chunks[a], chunks[b] = first, second
        ctx.group, ctx.rank, ctx.cp = group, rank, cp
        return torch.cat(chunks, dim=0)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        grad = grad.contiguous()
        torch.distributed.all_reduce(grad, group=ctx.group)
        chunks = grad.chunk(2 * ctx.cp, dim=0)
        a, b = chunk_order(ctx.rank, ctx.cp)
        return torch.cat([chunks[a], chunks[b]], dim=0), None


def _causal_by_position(local: int, whole: int, group, device, window: Optional[int] = None) -> torch.Tensor:
    """[local, whole] bool, True where a local query may attend a key: key position <= query position (and,
    with a sliding ``window``, query position - key position <= window)."""
    cp, rank = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    positions = torch.tensor(local_positions(local, rank, cp))[:, None]
    keys = torch.arange(whole)[None, :]
    visible = keys <= positions
    if window is not None:
        visible = visible & (positions - keys <= window)
    return visible.to(device)
