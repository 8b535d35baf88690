"""The Gemma 4 decoder layer (transformers' ``Gemma4TextDecoderLayer``), batched rows, with its own attention.

Per layer (kind: ``layer_types[i]``; an MTP layer, index >= num_hidden_layers, is built as the last layer is,
full attention, as training builds it):
  attention: q/k/v projections of the kind's head width and key/value heads (no v projection where keys are
  values: v is the key projection's output), per-head q_norm and k_norm, a v norm without weight, the kind's
  RoPE (models/gemma4/rope.py) at each token's position, scale 1.0, sliding layers seeing the last
  ``sliding_window`` positions (themselves included), then o_proj;
  x = x + post_attention_layernorm(attn(input_layernorm(x)))
  y = mlp(pre_feedforward_layernorm(x))                                   (GELU-tanh gated)
  with experts: y = post_feedforward_layernorm_1(y)
                   + post_feedforward_layernorm_2(experts(pre_feedforward_layernorm_2(x)))
      routed by router(x): softmax(proj(rmsnorm(x) · scale · H^-1/2)), top k renormalised, × per_expert_scale
  x = (x + post_feedforward_layernorm(y)) · layer_scalar
The KV cache holds k (normed, rotated) and v (normed) of every position, flattened over the key/value heads;
a sliding layer masks what lies outside its window (kept, so that a rollback never needs what it dropped).
Attribute names mirror the HF tensor names, so a layer loads with ``load_state_dict``. The family's
``decoder_layer`` (models/family.py), built on the shared blocks of models/decoding/.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import GatedMLP, RMSNorm, Rotary, StackedExperts
from megatron_mtp.models.gemma4.hf_view import FULL, Gemma4HFConfig
from megatron_mtp.models.gemma4.rope import apply_rope, rope_cos_sin, rope_inv_freq
from megatron_mtp.rms_norm import rms_norm


def layer_kind(config: Gemma4HFConfig, layer_index: int) -> str:
    """The attention of decoder layer ``layer_index``; an MTP layer's is full, as the last layer's."""
    return config.layer_types[layer_index] if layer_index < config.num_hidden_layers else FULL


class Gemma4Attention(nn.Module):
    """One layer's attention of its kind (module note), over packed rows."""

    def __init__(self, config: Gemma4HFConfig, layer_index: int) -> None:
        super().__init__()
        kind = layer_kind(config, layer_index)
        full = kind == FULL
        h = config.hidden_size
        self.head_dim = d = config.global_head_dim if full else config.head_dim
        self.heads, self.kv_heads = config.num_attention_heads, config.global_kv_heads if full else \
            config.num_key_value_heads
        self.window = None if full else config.sliding_window
        self.eps = config.rms_norm_eps
        self.q_proj = nn.Linear(h, self.heads * d, bias=False)
        self.k_proj = nn.Linear(h, self.kv_heads * d, bias=False)
        self.v_proj = None if (full and config.attention_k_eq_v) else nn.Linear(h, self.kv_heads * d, bias=False)
        self.o_proj = nn.Linear(self.heads * d, h, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.k_norm = RMSNorm(d, config.rms_norm_eps)
        base, share = ((config.global_rope_theta, config.global_partial_rotary_factor) if full
                       else (config.rope_theta, 1.0))
        self.inv_freq = rope_inv_freq(d, base, share, device="cpu")  # not a weight: never on meta

    def cache_dims(self) -> dict[str, int]:
        width = self.kv_heads * self.head_dim
        return {"k": width, "v": width}

    def _mask(self, rows: Rows, span: int):
        """[B, 1, T, S] visibility: causal, and for a sliding layer within its window."""
        positions = rows.positions[:, :, None]  # [B, T, 1]
        keys = torch.arange(span)[None, None, :]
        visible = keys <= positions
        if self.window is not None:
            visible = visible & (positions - keys < self.window)
        return visible.unsqueeze(1)

    def forward(self, x: torch.Tensor, cache: KVCache | None, rows: Rows) -> torch.Tensor:
        n = x.shape[0]
        q = self.q_norm(self.q_proj(x).view(n, self.heads, self.head_dim))
        k_raw = self.k_proj(x).view(n, self.kv_heads, self.head_dim)
        v = k_raw if self.v_proj is None else self.v_proj(x).view(n, self.kv_heads, self.head_dim)
        k = self.k_norm(k_raw)
        v = rms_norm(v, torch.ones((), dtype=v.dtype), self.eps)
        cos, sin = rope_cos_sin(self.inv_freq, rows.token_positions, q.dtype)
        q, k = apply_rope(q, cos[:, None], sin[:, None]), apply_rope(k, cos[:, None], sin[:, None])
        new = {"k": rows.unpack(k.reshape(n, -1)), "v": rows.unpack(v.reshape(n, -1))}
        kept = cache.write(rows, new) if cache is not None else new
        b, s = kept["k"].shape[:2]
        key = kept["k"].view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        value = kept["v"].view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        query = rows.unpack(q).transpose(1, 2)
        mask = rows.mask if self.window is None else self._mask(rows, s)
        out = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=1.0,
                                             enable_gqa=self.heads != self.kv_heads)
        return self.o_proj(rows.pack(out.transpose(1, 2)).reshape(n, -1))


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return F.gelu(x, approximate="tanh")


class Router(nn.Module):
    """``router.proj`` over rmsnorm(x) · scale · H^-1/2; softmax, top k renormalised, × per_expert_scale."""

    def __init__(self, config: Gemma4HFConfig) -> None:
        super().__init__()
        h, e = config.hidden_size, config.n_routed_experts
        self.proj = nn.Linear(h, e, bias=False)
        self.scale = nn.Parameter(torch.ones(h))
        self.per_expert_scale = nn.Parameter(torch.ones(e))
        self.top_k, self.eps, self.root = config.num_experts_per_tok, config.rms_norm_eps, h**-0.5

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        normed = rms_norm(x, torch.ones((), dtype=x.dtype), self.eps) * self.scale * self.root
        probs = F.softmax(self.proj(normed), dim=-1, dtype=torch.float32)
        weights, idx = torch.topk(probs, self.top_k, dim=-1)
        weights = weights / weights.sum(dim=-1, keepdim=True)
        return idx, weights * self.per_expert_scale[idx]


class Experts(StackedExperts):
    """``experts.gate_up_proj`` [E, 2I, H] and ``experts.down_proj`` [E, H, I], GELU-tanh, over the experts hit."""

    def __init__(self, config: Gemma4HFConfig) -> None:
        super().__init__(config.n_routed_experts, config.hidden_size, config.moe_intermediate_size)
        self.num_experts, self.top_k = config.n_routed_experts, config.num_experts_per_tok
        self.expert_recorder = None  # called with (tokens, distinct experts) per forward (expert_counts.py)

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return self.gate_up_proj[0].numel() + self.down_proj[0].numel()

    def forward(self, x: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        rows = idx.tolist()
        if self.expert_recorder is not None:
            self.expert_recorder(len(rows), len({expert for row in rows for expert in row}))
        return self.run_hit(x, rows, weights, act=gelu_tanh)


class Gemma4DecoderLayer(nn.Module):
    """One Gemma 4 decoder layer (module note); ``forward(x, cos_sin, cache, rows)`` as the other families' layers
    (``cos_sin`` is unused: each kind applies its own RoPE). ``attention`` builds its attention (the assistant's
    layers: query-only, assistant/decoder.py); ``sandwich`` is the layer around any attention."""

    def __init__(self, config: Gemma4HFConfig, layer_index: int, attention: type[nn.Module] | None = None) -> None:
        super().__init__()
        if config.hidden_activation != "gelu_pytorch_tanh":
            raise UserError(f"hidden_activation {config.hidden_activation!r} is not Gemma 4's gelu_pytorch_tanh; the "
                            "decoder runs GELU-tanh MLPs only.")
        h, eps = config.hidden_size, config.rms_norm_eps
        self.self_attn = (attention or Gemma4Attention)(config, layer_index)
        self.mlp = GatedMLP(h, config.intermediate_size, act=gelu_tanh)
        self.input_layernorm = RMSNorm(h, eps)
        self.post_attention_layernorm = RMSNorm(h, eps)
        self.pre_feedforward_layernorm = RMSNorm(h, eps)
        self.post_feedforward_layernorm = RMSNorm(h, eps)
        self.moe = bool(config.n_routed_experts)
        if self.moe:
            self.router = Router(config)
            self.experts = Experts(config)
            self.post_feedforward_layernorm_1 = RMSNorm(h, eps)
            self.post_feedforward_layernorm_2 = RMSNorm(h, eps)
            self.pre_feedforward_layernorm_2 = RMSNorm(h, eps)
        self.register_buffer("layer_scalar", torch.ones(1))

    def forward(self, x: torch.Tensor, cos_sin, cache: KVCache | None, rows: Rows) -> torch.Tensor:
        return self.sandwich(x, lambda normed: self.self_attn(normed, cache, rows))

    def sandwich(self, x: torch.Tensor, attend) -> torch.Tensor:
        """The layer over ``x`` with ``attend`` (normed input -> attention output) as its attention."""
        x = x + self.post_attention_layernorm(attend(self.input_layernorm(x)))
        y = self.mlp(self.pre_feedforward_layernorm(x))
        if self.moe:
            idx, weights = self.router(x)
            routed = self.experts(self.pre_feedforward_layernorm_2(x), idx, weights)
            y = self.post_feedforward_layernorm_1(y) + self.post_feedforward_layernorm_2(routed)
        return (x + self.post_feedforward_layernorm(y)) * self.layer_scalar.to(x.dtype)

    def new_cache(self, dtype: torch.dtype, slots: int = 1) -> KVCache:
        return KVCache(self.self_attn.cache_dims(), dtype, slots)

    @staticmethod
    def rotary(config: Gemma4HFConfig) -> Rotary | None:
        """None: each attention kind applies its own RoPE."""
        return None
