"""DeepSeek-V3's multi-head latent attention for decoding, with its latent KV cache (kv_cache.py):
the normed latent and the rotated shared key are cached, the per-head keys and values are expanded
from the latent at every forward. Math as transformers' ``modeling_deepseek_v3`` (layers.py's note).
An attention kind any family may name (``MLADecoderLayer``); it reads the MLA fields of the family's
config.json view (DeepSeek-V3's: q_lora_rank, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim,
rope_interleave, rope_scaling).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import DecoderLayer, RMSNorm, Rotary, rotate_half, yarn_mscale
from megatron_mtp.models.hf_common import HFView


def apply_rope(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleave: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [N,H,D] and k [N,1,D] by cos/sin [N,D]; ``interleave`` pairs dims (0,1),(2,3)... as DeepSeek does."""
    if interleave:
        cos_h = cos[..., : cos.shape[-1] // 2].unsqueeze(1)
        sin_h = sin[..., : sin.shape[-1] // 2].unsqueeze(1)
        q1, q2 = q[..., 0::2], q[..., 1::2]
        k1, k2 = k[..., 0::2], k[..., 1::2]
        q_out = torch.cat([q1 * cos_h - q2 * sin_h, q2 * cos_h + q1 * sin_h], dim=-1)
        k_out = torch.cat([k1 * cos_h - k2 * sin_h, k2 * cos_h + k1 * sin_h], dim=-1)
        return q_out, k_out
    cos_u, sin_u = cos.unsqueeze(1), sin.unsqueeze(1)
    return q * cos_u + rotate_half(q) * sin_u, k * cos_u + rotate_half(k) * sin_u


class MLAttention(nn.Module):
    """Multi-head latent attention; caches the compressed latent, expands K/V per call."""

    def __init__(self, config: HFView) -> None:
        super().__init__()
        self.config = config
        h, hd = config.hidden_size, config.num_attention_heads
        if config.q_lora_rank is None:
            self.q_proj = nn.Linear(h, hd * config.qk_head_dim, bias=False)
        else:
            self.q_a_proj = nn.Linear(h, config.q_lora_rank, bias=config.attention_bias)
            self.q_a_layernorm = RMSNorm(config.q_lora_rank, 1e-6)
            self.q_b_proj = nn.Linear(config.q_lora_rank, hd * config.qk_head_dim, bias=False)
        kv_a_size = config.kv_lora_rank + config.qk_rope_head_dim
        self.kv_a_proj_with_mqa = nn.Linear(h, kv_a_size, bias=config.attention_bias)
        self.kv_a_layernorm = RMSNorm(config.kv_lora_rank, 1e-6)
        self.kv_b_proj = nn.Linear(config.kv_lora_rank, hd * (config.qk_nope_head_dim + config.v_head_dim), bias=False)
        self.o_proj = nn.Linear(hd * config.v_head_dim, h, bias=config.attention_bias)
        scaling = config.qk_head_dim**-0.5
        if config.rope_scaling is not None and config.rope_scaling.mscale_all_dim:
            m = yarn_mscale(config.rope_scaling.factor, config.rope_scaling.mscale_all_dim)
            scaling *= m * m
        self.scaling = scaling

    @staticmethod
    def rotary(config: HFView) -> Rotary:
        return Rotary(config.qk_rope_head_dim, config.rope_theta, config.rope_scaling)

    def cache_dims(self) -> dict[str, int]:
        """What MLA caches per position: the normed latent and the rotated shared key."""
        return {"latent": self.config.kv_lora_rank, "k_rot": self.config.qk_rope_head_dim}

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        rows: Rows,
    ) -> torch.Tensor:
        """Packed tokens [N, h] of ``rows`` in, [N, h] out."""
        query, new, _ = self.project(x, cos_sin, rows)
        # the cache, in one place: new entries in, every row's entries (padded to S) out
        kept = cache.write(rows, new) if cache is not None else new
        return self.attend(query, kept, rows.mask, rows)

    def project(
        self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], rows: Rows
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor | None]:
        """(query [B, H, T, qk], the new cache entries [B, T, dim] by name, the query's normed latent [N, q_lora_rank]
        or None without q-LoRA)."""
        c = self.config
        n = x.shape[0]
        q_latent = None
        if c.q_lora_rank is None:
            q = self.q_proj(x)
        else:
            q_latent = self.q_a_layernorm(self.q_a_proj(x))
            q = self.q_b_proj(q_latent)
        q = q.view(n, -1, c.qk_head_dim)
        q_nope, q_rot = torch.split(q, [c.qk_nope_head_dim, c.qk_rope_head_dim], dim=-1)
        latent, k_rot = torch.split(self.kv_a_proj_with_mqa(x), [c.kv_lora_rank, c.qk_rope_head_dim], dim=-1)
        latent = self.kv_a_layernorm(latent)
        q_rot, k_rot = apply_rope(q_rot, k_rot.unsqueeze(1), cos_sin[0], cos_sin[1], c.rope_interleave)
        query = rows.unpack(torch.cat([q_nope, q_rot], dim=-1)).transpose(1, 2)  # [B, H, T, qk]
        return query, {"latent": rows.unpack(latent), "k_rot": rows.unpack(k_rot[:, 0])}, q_latent

    def attend(self, query: torch.Tensor, kept: dict[str, torch.Tensor], mask: torch.Tensor | None,
               rows: Rows) -> torch.Tensor:
        """Attention of ``query`` [B, H, T, qk] over every row's cached entries ``kept`` [B, S, dim], key j visible to
        query i of row b where ``mask`` [B, 1, T, S] says (None: all); [N, h] out."""
        c = self.config
        latent, k_rot = kept["latent"], kept["k_rot"]  # [B, S, r], [B, S, rope]
        b, s = latent.shape[:2]
        kv = self.kv_b_proj(latent).view(b, s, -1, c.qk_nope_head_dim + c.v_head_dim).transpose(1, 2)
        k_nope, value = torch.split(kv, [c.qk_nope_head_dim, c.v_head_dim], dim=-1)
        key = torch.cat([k_nope, k_rot.unsqueeze(1).expand(-1, k_nope.shape[1], -1, -1)], dim=-1)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=self.scaling)
        return self.o_proj(rows.pack(out.transpose(1, 2)).reshape(rows.tokens, -1))


class MLADecoderLayer(DecoderLayer):
    """The shared decoder layer around multi-head latent attention (a family's ``decoder_layer``)."""

    ATTENTION = MLAttention
