"""The EAGLE-3 drafter's decoder layers (megatron-core linears and MLP, the local RMSNorm) and their attention over
the draft steps of one training forward.

Design note: which keys a draft step sees ("training-time test"). The drafter runs its K steps over every anchor
position t of a sequence at once. Step 0 at t reads the target's state at t and the token t + 1; step k > 0 reads
step k - 1's output at t and the token t + 1 + k, as drafting does with the tokens it drafted. A query of step k at
t sees the keys step 0 wrote at positions 0..t (the context: in decoding, what the target's accepted tokens left in
the drafter's cache) and the keys steps 1..k wrote at t itself (the drafter's own earlier drafts from that anchor),
nothing else: step k's query at t and the keys of any step at t' != t (k > 0) belong to other draft chains. So a
layer keeps, per step, its keys and values at every position; the scores are q·K₀ᵀ under a causal mask plus one
score per later step (q·K_j at the same position), softmaxed together in fp32. That is the mask speculators builds
(causal and same-document over the first block, the diagonal of each later block), with one sequence as one
document, as the target attends. Rotary positions: step k at anchor t sits at position t + 1 + k (the position of
the token it reads), with the HF Llama rotary embedding (rotate-half, rope_theta, whole head_dim).
"""

from __future__ import annotations

import torch
from megatron.core.transformer.module import MegatronModule


def rotary_tables(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [b, s, head_dim] fp32 of integer ``positions`` [b, s] (HF's default Llama rope)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float()
                                / head_dim))
    freqs = positions.float()[..., None] * inv_freq
    angles = torch.cat([freqs, freqs], dim=-1)
    return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` [b, n, s, d] by (cos, sin) [b, s, d] (rotate-half convention), in its own dtype."""
    cos, sin = cos[:, None].to(x.dtype), sin[:, None].to(x.dtype)
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def draft_attention(q: torch.Tensor, keys: list[torch.Tensor], values: list[torch.Tensor],
                    scale: float) -> torch.Tensor:
    """softmax over [q·K₀ᵀ (causal) ; q·K_j at the same position, j >= 1] of the values (module note). ``q`` [b, h, s,
    d]; ``keys``/``values``: one [b, g, s, d] per step so far (g key/value heads, each serving h / g consecutive
    query heads). Returns [b, h, s, d]."""
    rep = q.shape[1] // keys[0].shape[1]
    keys = [k.repeat_interleave(rep, dim=1) if rep > 1 else k for k in keys]
    values = [v.repeat_interleave(rep, dim=1) if rep > 1 else v for v in values]
    s = q.shape[2]
    scores = torch.matmul(q, keys[0].transpose(-1, -2)).float() * scale
    future = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    scores = scores.masked_fill(future, float("-inf"))
    diagonal = [(q * k).sum(-1, keepdim=True).float() * scale for k in keys[1:]]
    probs = torch.softmax(torch.cat([scores, *diagonal], dim=-1), dim=-1).to(q.dtype)
    out = torch.matmul(probs[..., :s], values[0])
    for j, v in enumerate(values[1:]):
        out = out + probs[..., s + j:s + j + 1] * v
    return out


class DraftAttention(MegatronModule):
    """Self-attention with separate q/k/v projections from ``input_size`` (2 × hidden in the first layer) and the
    draft steps' keys (module note). Checkpoint keys: ``linear_q``, ``linear_k``, ``linear_v``, ``linear_proj``."""

    def __init__(self, config, input_size: int, heads: int, groups: int, head_dim: int):
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

        super().__init__(config=config)
        self.heads, self.groups, self.head_dim = heads, groups, head_dim
        column = dict(config=config, init_method=config.init_method, bias=False, gather_output=False)
        self.linear_q = ColumnParallelLinear(input_size, heads * head_dim, **column)
        self.linear_k = ColumnParallelLinear(input_size, groups * head_dim, **column)
        self.linear_v = ColumnParallelLinear(input_size, groups * head_dim, **column)
        self.linear_proj = RowParallelLinear(heads * head_dim, config.hidden_size, config=config,
                                             init_method=config.output_layer_init_method, bias=False,
                                             input_is_parallel=True, skip_bias_add=True)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        """[s, b, n·d] -> [b, n, s, d]."""
        s, b = x.shape[:2]
        return x.view(s, b, -1, self.head_dim).permute(1, 2, 0, 3)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list) -> torch.Tensor:
        """[s, b, input] -> [s, b, hidden]; appends this step's (keys, values) to ``cache``."""
        q = apply_rotary(self._heads(self.linear_q(x)[0]), cos, sin)
        k = apply_rotary(self._heads(self.linear_k(x)[0]), cos, sin)
        cache.append((k, self._heads(self.linear_v(x)[0])))
        out = draft_attention(q, [c[0] for c in cache], [c[1] for c in cache], self.head_dim ** -0.5)
        b, n, s, d = out.shape
        return self.linear_proj(out.permute(2, 0, 1, 3).reshape(s, b, n * d))[0]


class DraftLayer(MegatronModule):
    """A Llama decoder layer; the first one reads [embedding ; hidden] (2 × hidden): its input norm takes the
    embedding half, ``hidden_norm`` the hidden half, and the residual is the hidden half (normed with
    norm_before_residual), as speculators' first layer. Checkpoint keys: ``input_layernorm``, ``hidden_norm`` (first
    layer), ``self_attention.*``, ``pre_mlp_layernorm``, ``mlp.linear_fc1`` ([gate ; up]), ``mlp.linear_fc2``."""

    def __init__(self, config, first: bool, heads: int, groups: int, head_dim: int, norm_before_residual: bool):
        from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
        from megatron.core.transformer.mlp import MLP, MLPSubmodules

        from megatron_mtp.platform.local_modules import RMSNorm

        super().__init__(config=config)
        width, eps = config.hidden_size, config.layernorm_epsilon
        self.first, self.norm_before_residual = first, norm_before_residual
        self.input_layernorm = RMSNorm(config, width, eps)
        if first:
            self.hidden_norm = RMSNorm(config, width, eps)
        self.self_attention = DraftAttention(config, 2 * width if first else width, heads, groups, head_dim)
        self.pre_mlp_layernorm = RMSNorm(config, width, eps)
        self.mlp = MLP(config, MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear),
                       ffn_hidden_size=config.ffn_hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, cache: list) -> torch.Tensor:
        if self.first:
            embedding, hidden = x.chunk(2, dim=-1)
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embedding), normed], dim=-1)
        else:
            residual, x = x, self.input_layernorm(x)
        x = residual + self.self_attention(x, cos, sin, cache)
        out, _ = self.mlp(self.pre_mlp_layernorm(x))
        return x + out
