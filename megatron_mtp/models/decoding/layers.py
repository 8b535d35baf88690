"""The decoder's building blocks every family shares: RMSNorm, (YaRN) RoPE, dense MLP, sigmoid- or
softmax-routed MoE, the scaled embedding and soft-capped logits, and the decoder layer around an attention
class: MLA with its latent KV cache (mla.py, DeepSeek-V3) or grouped-query attention (gqa.py, GLM-4.5 and
Qwen3-MoE); a family names its layer class (``Family.decoder_layer``). Every family's config.json view is
read through the fields models.hf_common.HFView names.

Attribute names mirror the Hugging Face tensor names (``mlp.gate``, ``self_attn.*``...), so a layer loads
with ``load_state_dict`` from an export; routed experts are stacked on an expert axis under
transformers 5's names (``mlp.experts.gate_up_proj``), assembled by the loader from HF's per-expert
``mlp.experts.{e}.gate_proj/up_proj/down_proj``.
The math follows transformers' ``modeling_deepseek_v3`` (the reference the tests compare against,
to 1e-5 in fp32), except that RMSNorm multiplies by its weight before casting back (the trained
model's order; the same numbers in fp32). It is written out here so the cache can be cut back in
O(1) and the per-call Python overhead stays small on CPU (see README.md, "Why our own model").
Shapes: N new tokens of all sequences packed, B sequences (rows), T new positions of the longest row,
S cached + new positions of the longest row, H heads. Only attention sees rows (kv_cache.py's note).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.hf_common import HFView as HFConfig
from megatron_mtp.models.hf_common import YarnScaling
from megatron_mtp.rms_norm import rms_norm


class RMSNorm(nn.Module):
    """``model.norm``-style RMSNorm holding an HF ``weight`` (math: megatron_mtp/rms_norm.py)."""

    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


class Rotary:
    """Inverse frequencies and cos/sin tables for the ``dim`` rotated dimensions of each head
    (MLA: ``qk_rope_head_dim``; GQA: the first ``head_dim * partial_rotary_factor``)."""

    def __init__(self, dim: int, theta: float, yarn: YarnScaling | None = None) -> None:
        self.dim = dim
        exponents = torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim
        if yarn is None:
            self.inv_freq = 1.0 / (theta**exponents)
            self.attention_factor = 1.0
        else:
            self.inv_freq, self.attention_factor = self._yarn(yarn, theta, dim, exponents)

    @staticmethod
    def _yarn(rope: YarnScaling, theta: float, dim: int, exponents: torch.Tensor) -> tuple[torch.Tensor, float]:
        factor = rope.factor
        if rope.attention_factor is not None:
            attention_factor = float(rope.attention_factor)
        elif rope.mscale and rope.mscale_all_dim:
            attention_factor = yarn_mscale(factor, rope.mscale) / yarn_mscale(factor, rope.mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
        original = rope.original_max_position_embeddings

        def correction_dim(rotations: float) -> float:
            return (dim * math.log(original / (rotations * 2 * math.pi))) / (2 * math.log(theta))

        low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
        if rope.truncate:
            low, high = math.floor(low), math.ceil(high)
        low, high = max(low, 0), min(high, dim - 1)
        if low == high:
            high += 0.001
        ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32, device="cpu") - low) / (high - low), 0, 1)
        extrapolation_weight = 1 - ramp
        pos_freqs = theta**exponents
        inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation_weight) + (1.0 / pos_freqs) * extrapolation_weight
        return inv_freq, attention_factor

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of shape [N, dim] for the (packed) token positions [N]."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_factor).to(dtype), (emb.sin() * self.attention_factor).to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class GatedMLP(nn.Module):
    """Gated feed-forward: ``down(act(gate(x)) * up(x))``, SwiGLU (act = silu) unless told (Gemma 4: GELU-tanh)."""

    def __init__(self, hidden: int, inner: int, act=F.silu) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inner, bias=False)
        self.up_proj = nn.Linear(hidden, inner, bias=False)
        self.down_proj = nn.Linear(inner, hidden, bias=False)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(self.act(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """Top-k routing by the view's ``scoring_func``: DeepSeek-V3's ``noaux_tc`` (sigmoid scores,
    bias-corrected group-limited top-k, the weights from the uncorrected scores; GLM-4.5's too), or
    softmax over every expert then the top k (Qwen3-MoE); either renormalised over the k when
    ``norm_topk_prob``, then scaled by ``routed_scaling_factor``."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        n = config.n_routed_experts
        self.config = config
        self.softmax = config.scoring_func == "softmax"
        self.weight = nn.Parameter(torch.zeros(n, config.hidden_size, dtype=torch.float32))
        if not self.softmax:
            self.register_buffer("e_score_correction_bias", torch.zeros(n, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        logits = F.linear(x.to(torch.float32), self.weight.to(torch.float32))
        if self.softmax:
            weights, idx = torch.topk(logits.softmax(dim=-1), k=c.num_experts_per_tok, dim=-1)
        else:
            idx, weights = self._noaux_tc(logits.sigmoid())
        if c.norm_topk_prob:
            weights = weights / (weights.sum(dim=-1, keepdim=True) + (0.0 if self.softmax else 1e-20))
        return idx, weights * c.routed_scaling_factor

    def _noaux_tc(self, scores: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        n = c.n_routed_experts
        choice = scores + self.e_score_correction_bias
        group_scores = choice.view(-1, c.n_group, n // c.n_group).topk(2, dim=-1)[0].sum(dim=-1)
        group_idx = torch.topk(group_scores, k=c.topk_group, dim=-1, sorted=False)[1]
        group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
        score_mask = group_mask.unsqueeze(-1).expand(-1, c.n_group, n // c.n_group).reshape(-1, n)
        choice = choice.masked_fill(~score_mask.bool(), float("-inf"))
        idx = torch.topk(choice, k=c.num_experts_per_tok, dim=-1, sorted=False)[1]
        return idx, scores.gather(1, idx)


def tokens_by_expert(rows: list[list[int]]) -> dict[int, tuple[list[int], list[int]]]:
    """expert -> (tokens, top-k slots) routed to it, from each token's chosen experts: grouped on the host
    (cheaper than unique/where at decoding sizes); callers run the experts in ascending order, as transformers."""
    groups: dict[int, tuple[list[int], list[int]]] = {}
    for token, row in enumerate(rows):
        for slot, expert in enumerate(row):
            tokens, slots = groups.setdefault(expert, ([], []))
            tokens.append(token)
            slots.append(slot)
    return groups


class StackedExperts(nn.Module):
    """Routed expert weights stacked on a leading expert axis (transformers 5 names:
    ``experts.gate_up_proj`` [E, 2I, H] = [gate; up] per expert, ``experts.down_proj`` [E, H, I]);
    the loader fills them from HF's per-expert ``experts.{e}.gate_proj/up_proj/down_proj``."""

    def __init__(self, num_experts: int, hidden: int, inner: int) -> None:
        super().__init__()
        self.inner = inner
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * inner, hidden))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden, inner))

    def run_hit(self, flat: torch.Tensor, rows: list[list[int]], weights: torch.Tensor, act=F.silu) -> torch.Tensor:
        """The experts hit by ``rows`` (each token's chosen experts), one at a time in ascending order as in
        transformers, each output times the token's routing weight ``weights`` [tokens, k]."""
        groups = tokens_by_expert(rows)
        out = torch.zeros_like(flat)
        for expert in sorted(groups):
            tokens, slots = groups[expert]
            gate, up = F.linear(flat[tokens], self.gate_up_proj[expert]).split(self.inner, dim=-1)
            y = F.linear(act(gate) * up, self.down_proj[expert]) * weights[tokens, slots, None]
            out.index_add_(0, torch.tensor(tokens), y.to(out.dtype))
        return out


class MoE(nn.Module):
    """Routed experts plus always-on shared experts (where the model has them).

    Two equivalent evaluations (tested against transformers to 1e-5):
    - loop over the experts hit (~8 ops each), the right choice when few of many experts are hit
      (DeepSeek-V3: 8 of 256 per token);
    - all experts as two batched matmuls, routing weights selecting: a handful of ops whatever the
      number of tokens, at most 1/DENSE_EXPERT_FRACTION times the useful FLOPs.
    At batch-1 decode sizes dispatch overhead, not FLOPs, dominates small experts, and verifying
    K+1 tokens hits more experts than one token; the batched form keeps the verify forward about
    as cheap as a single-token one (the cost ratio the Leviathan speedup assumes).
    """

    #: run all experts batched once at least this fraction of them is hit
    DENSE_EXPERT_FRACTION = 0.25

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        self.num_experts = config.n_routed_experts
        self.top_k = config.num_experts_per_tok
        self.gate = Router(config)
        self.experts = StackedExperts(self.num_experts, config.hidden_size, config.moe_intermediate_size)
        self.shared_experts = (GatedMLP(config.hidden_size, config.moe_intermediate_size * config.n_shared_experts)
                               if config.n_shared_experts else None)
        self.expert_recorder = None  # called with (tokens, distinct experts) per forward (expert_counts.py)

    def expert_params(self) -> int:
        """Parameters of one routed expert."""
        return sum(p[0].numel() for p in self.experts.parameters())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(-1, shape[-1])
        idx, weights = self.gate(flat)
        rows = idx.tolist()
        hit = {expert for row in rows for expert in row}
        if self.expert_recorder is not None:
            self.expert_recorder(len(rows), len(hit))
        if len(hit) >= self.DENSE_EXPERT_FRACTION * self.num_experts:
            routed = self._all_experts(flat, idx, weights)
        else:
            routed = self.experts.run_hit(flat, rows, weights)
        routed = routed.view(shape)
        return routed if self.shared_experts is None else routed + self.shared_experts(x)

    def _all_experts(self, flat: torch.Tensor, idx: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        gate, up = torch.matmul(flat, self.experts.gate_up_proj.transpose(1, 2)).split(self.experts.inner, dim=-1)
        y = torch.matmul(F.silu(gate) * up, self.experts.down_proj.transpose(1, 2))  # [E, T, H]
        routing = torch.zeros(flat.shape[0], self.num_experts, dtype=weights.dtype).scatter_(1, idx, weights)
        return torch.einsum("eth,te->th", y, routing.to(y.dtype))


class DecoderLayer(nn.Module):
    """Pre-norm block: ``x + attn(norm(x))`` then ``x + mlp(norm(x))``; MoE or dense by index.
    ``ATTENTION`` is its attention class (a subclass per attention kind: mla.py, gqa.py), which also makes the
    rotary table every layer of the model shares (``rotary``)."""

    ATTENTION: type[nn.Module]

    def __init__(self, config: HFConfig, layer_index: int) -> None:
        super().__init__()
        self.self_attn = self.ATTENTION(config)
        self.mlp: nn.Module = (
            MoE(config) if config.is_moe_layer(layer_index) else GatedMLP(config.hidden_size, config.intermediate_size)
        )
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        rows: Rows,
    ) -> torch.Tensor:
        """Packed tokens [N, h] of ``rows`` in, [N, h] out."""
        x = x + self.self_attn(self.input_layernorm(x), cos_sin, cache, rows)
        return x + self.mlp(self.post_attention_layernorm(x))

    def new_cache(self, dtype: torch.dtype, slots: int = 1) -> KVCache:
        return KVCache(self.self_attn.cache_dims(), dtype, slots)

    @classmethod
    def rotary(cls, config: HFConfig) -> Rotary | None:
        """The rotary table the model computes once per forward for all its layers (None: each layer applies its
        own)."""
        return cls.ATTENTION.rotary(config)


def embed(table: nn.Embedding, ids: torch.Tensor, config: HFConfig) -> torch.Tensor:
    """The embedding of ``ids``, times the family's ``embedding_multiplier`` (cast to its dtype) where it has one."""
    x = table(ids)
    scale = getattr(config, "embedding_multiplier", None)
    return x if scale is None else x * torch.tensor(scale, dtype=x.dtype)


def softcap(logits: torch.Tensor, config: HFConfig) -> torch.Tensor:
    """c·tanh(logits / c) for a family with ``final_logit_softcapping`` c; the logits otherwise."""
    cap = getattr(config, "final_logit_softcapping", None)
    return logits if cap is None else cap * torch.tanh(logits / cap)
