"""Grouped-query attention of GLM-4.5 and Qwen3-MoE (transformers' ``Glm4MoeAttention``), batched rows; the
families name it through ``GQADecoderLayer`` and read their config.json through models/gqa/'s shared view.

Per layer: ``q/k/v_proj`` (bias when ``attention_bias``), then, with ``use_qk_norm``, an RMSNorm of
width ``head_dim`` on every query and key head, then RoPE on the FIRST ``rotary_dim = head_dim *
partial_rotary_factor`` dimensions of each head in rotate-half style (the rest pass unrotated), then
causal attention where each group of ``num_attention_heads // num_key_value_heads`` query heads
shares one key/value head, then ``o_proj`` (never a bias). Scale ``head_dim ** -0.5``.

The KV cache (``kv_cache.KVCache``) holds two buffers per position, ``k`` (after norm and rotation)
and ``v``, each flattened over the key/value heads to ``kv_heads * head_dim``
(:meth:`GQAttention.cache_dims`). As for MLA, everything but attention runs on the packed tokens
``[N, hidden]``; the new keys/values are unpacked to ``[B, T, ...]``, written at each row's slot end,
and every row's entries come back padded to S and hidden past the row's own span by ``rows.mask``
(kv_cache.py's note). Rollback is the cache's own per-slot ``truncate``.
Shapes: N packed new tokens, B rows, T new positions of the longest row, S cached + new positions of
the longest row, H query heads, G key/value heads, D head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import DecoderLayer, RMSNorm, Rotary, rotate_half
from megatron_mtp.models.gqa.hf_view import GroupedQueryHFConfig


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x [N, heads, D] (rotate-half) by cos/sin [N, dim]; keep the rest."""
    dim = cos.shape[-1]
    cos_u, sin_u = cos.unsqueeze(1), sin.unsqueeze(1)  # [N, 1, dim]
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat([rot * cos_u + rotate_half(rot) * sin_u, rest], dim=-1)


class GQAttention(nn.Module):
    """Grouped-query attention (GLM-4.5, Qwen3-MoE: a view with use_qk_norm and rotary_dim) with a rollback-able
    key/value cache (module docstring)."""

    def __init__(self, config: GroupedQueryHFConfig) -> None:
        super().__init__()
        h, d = config.hidden_size, config.head_dim
        self.heads, self.kv_heads, self.head_dim = config.num_attention_heads, config.num_key_value_heads, d
        self.q_proj = nn.Linear(h, self.heads * d, bias=config.attention_bias)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=config.attention_bias)
        self.v_proj = nn.Linear(h, self.kv_heads * d, bias=config.attention_bias)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps) if config.use_qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps) if config.use_qk_norm else None
        self.scaling = d**-0.5

    @staticmethod
    def rotary(config: GroupedQueryHFConfig) -> Rotary:
        return Rotary(config.rotary_dim, config.rope_theta)

    def cache_dims(self) -> dict[str, int]:
        """What GQA caches per position: keys (normed, rotated) and values, flattened over the kv heads."""
        width = self.kv_heads * self.head_dim
        return {"k": width, "v": width}

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        rows: Rows,
    ) -> torch.Tensor:
        """Packed tokens [N, h] of ``rows`` in, [N, h] out."""
        n = x.shape[0]
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_partial_rope(q, *cos_sin), apply_partial_rope(k, *cos_sin)
        # the cache, in one place: new entries in, every row's entries (padded to S) out
        new = {"k": rows.unpack(k.reshape(n, -1)), "v": rows.unpack(v.reshape(n, -1))}
        kept = cache.write(rows, new) if cache is not None else new
        b, s = kept["k"].shape[:2]
        key = kept["k"].view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)  # [B, G, S, D]
        value = kept["v"].view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        query = rows.unpack(q).transpose(1, 2)  # [B, H, T, D]
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=rows.mask, scale=self.scaling,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(rows.pack(out.transpose(1, 2)).reshape(n, -1))


class GQADecoderLayer(DecoderLayer):
    """The shared decoder layer around grouped-query attention (a family's ``decoder_layer``)."""

    ATTENTION = GQAttention
