"""Grouped-query attention of the GLM-4.5 family (transformers' ``Glm4MoeAttention``), batch 1.

Per layer: ``q/k/v_proj`` (bias when ``attention_bias``), then, with ``use_qk_norm``, an RMSNorm of
width ``head_dim`` on every query and key head, then RoPE on the FIRST ``rotary_dim = head_dim *
partial_rotary_factor`` dimensions of each head in rotate-half style (the rest pass unrotated), then
causal attention where each group of ``num_attention_heads // num_key_value_heads`` query heads
shares one key/value head, then ``o_proj`` (never a bias). Scale ``head_dim ** -0.5``.

The KV cache is ``kv_cache.LatentKVCache`` used as two buffers of shape [1, 1, S, kv_heads*head_dim]:
the first holds the keys (after norm and rotation), the second the values, each flattened over the
key/value heads. :meth:`GQAttention.new_cache` and :meth:`GQAttention._through_cache` are the only
code that knows this layout; rollback is the cache's own ``truncate``.
Shapes: T new positions, S cached + new positions, H query heads, G key/value heads, D head_dim.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.inference.kv_cache import LatentKVCache
from megatron_mtp.inference.layers import RMSNorm, Rotary, rotate_half
from megatron_mtp.models.glm4_moe.hf_config_json import Glm4MoeHFConfig


def apply_partial_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``cos.shape[-1]`` dims of x [1, T, heads, D] (rotate-half); keep the rest."""
    dim = cos.shape[-1]
    cos_u, sin_u = cos.unsqueeze(2), sin.unsqueeze(2)  # [1, T, 1, dim]
    rot, rest = x[..., :dim], x[..., dim:]
    return torch.cat([rot * cos_u + rotate_half(rot) * sin_u, rest], dim=-1)


class GQAttention(nn.Module):
    """GLM-4.5 attention with a rollback-able key/value cache (module docstring)."""

    def __init__(self, config: Glm4MoeHFConfig) -> None:
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
    def rotary(config: Glm4MoeHFConfig) -> Rotary:
        return Rotary(config.rotary_dim, config.rope_theta)

    @staticmethod
    def new_cache(config: Glm4MoeHFConfig, dtype: torch.dtype) -> LatentKVCache:
        """One layer's cache: keys in the first buffer, values in the second, flattened over kv heads."""
        width = config.num_key_value_heads * config.head_dim
        return LatentKVCache(width, width, dtype)

    def _through_cache(
        self, k: torch.Tensor, v: torch.Tensor, cache: LatentKVCache | None, start: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append the new k, v [1, T, G, D] at ``start``; return every valid position's as [1, G, S, D]."""
        if cache is not None:
            t = k.shape[1]
            keys, values = cache.append(k.reshape(1, 1, t, -1), v.reshape(1, 1, t, -1), start)
            k = keys.view(1, keys.shape[2], self.kv_heads, self.head_dim)
            v = values.view(1, values.shape[2], self.kv_heads, self.head_dim)
        return k.transpose(1, 2), v.transpose(1, 2)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: LatentKVCache | None,
        start: int,
    ) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.heads, self.head_dim)
        k = self.k_proj(x).view(b, t, self.kv_heads, self.head_dim)
        v = self.v_proj(x).view(b, t, self.kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_partial_rope(q, *cos_sin), apply_partial_rope(k, *cos_sin)
        key, value = self._through_cache(k, v, cache, start)
        s = key.shape[2]
        mask = None
        if t > 1:  # causal over the new positions; all cached positions are visible
            mask = torch.arange(s)[None, :] <= (torch.arange(t)[:, None] + s - t)
        out = F.scaled_dot_product_attention(q.transpose(1, 2), key, value, attn_mask=mask, scale=self.scaling,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))
