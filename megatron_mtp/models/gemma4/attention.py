"""Gemma 4's attention as a megatron-core module (its spec: models/gemma4/specs.py).

Design note. megatron-core's SelfAttention sizes every layer from one TransformerConfig and fuses q, k
and v into one projection; a Gemma 4 model has two kinds of layers with different head widths and
key/value heads, and its full-attention layers have no value projection at all (the key projection's
output is the value). So this module is built per layer from its kind's numbers (spec params), with its
own projections (megatron-core's column/row-parallel linears, or Transformer Engine's):
  q = q_norm(W_q x), k = k_norm(W_k x), v = v_norm(W_v x or W_k x)  (per head; v_norm has no weight)
  q, k = RoPE(q), RoPE(k);   out = post_norm(W_o · softmax(q kᵀ · 1.0 + mask) v)
The attention scale is 1.0 (the q/k norms set the logits' size). RoPE is the rotate-half form over the
whole head with frequencies θ^(-2i/d) for the first ``share`` of the d/2 pairs and 0 (no rotation) for
the rest: transformers' "default" RoPE when share = 1, its "proportional" one otherwise. Positions count
from 0 in each sequence (with context parallelism: the positions of the two chunks a rank holds). The
sliding window reaches the core attention through its config's
``window_size`` (left, 0), which megatron-core's local and TE attentions both read; under context
parallelism a sliding layer's core attention gets ``core_cp_comm`` (specs.py: Transformer Engine's
all-to-all, as its default ring refuses a window), a full layer's what TransformerLayer hands every
attention (the config's cp_comm_type; None: TE's default). The post-attention
norm (a sandwich norm) is applied here, so the layer's bias-dropout-add adds the normed output.
With sequence parallelism each projection gathers the sequence itself (three gathers where a fused
projection needs one; the fused form would interleave q, k and v per group in one tensor).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from megatron_mtp.models.gemma4.rope import apply_rope, rope_cos_sin, rope_inv_freq
from megatron_mtp.rms_norm import rms_norm


@dataclass
class Gemma4AttentionSubmodules:
    linear_q: Any
    linear_k: Any
    linear_v: Any
    linear_proj: Any
    core_attention: Any
    q_layernorm: Any
    k_layernorm: Any
    post_layernorm: Any


class Gemma4Attention(MegatronModule):
    """One Gemma 4 attention block over [s, b, h] (module note)."""

    def __init__(self, config, submodules: Gemma4AttentionSubmodules, layer_number: int, *, head_dim: int,
                 query_groups: int, shares_kv: bool, rope_base: float, rope_share: float,
                 window: Optional[int], attn_mask_type=AttnMaskType.causal, pg_collection=None,
                 core_cp_comm: Optional[str] = None, cp_comm_type: Optional[str] = None, **_):
        super().__init__(config=config)
        from megatron.core.process_groups_config import ProcessGroupCollection

        pg_collection = pg_collection or ProcessGroupCollection.use_mpu_process_groups()
        tp = pg_collection.tp.size()
        self.layer_number = layer_number
        self.head_dim = head_dim
        self.heads = config.num_attention_heads // tp
        self.groups = query_groups // tp
        self.eps = config.layernorm_epsilon
        linear = dict(config=config, init_method=config.init_method, gather_output=False, bias=False,
                      skip_bias_add=False, is_expert=False, tp_group=pg_collection.tp)
        h = config.hidden_size
        self.linear_q = submodules.linear_q(h, config.num_attention_heads * head_dim, tp_comm_buffer_name="q",
                                            **linear)
        self.linear_k = submodules.linear_k(h, query_groups * head_dim, tp_comm_buffer_name="k", **linear)
        self.linear_v = None if shares_kv else submodules.linear_v(h, query_groups * head_dim,
                                                                   tp_comm_buffer_name="v", **linear)
        norm = dict(config=config, hidden_size=head_dim, eps=self.eps)
        self.q_layernorm = submodules.q_layernorm(**norm)
        self.k_layernorm = submodules.k_layernorm(**norm)
        attention_tail(self, submodules, layer_number, head_dim, query_groups, None if window is None else window - 1,
                       (rope_base, rope_share), pg_collection, cp_comm_type=core_cp_comm or cp_comm_type)
        self.store_kv = False  # the layer an assistant reads keeps its last forward's keys/values (assistant/)
        self.stored_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def _positions(self, s: int, device) -> torch.Tensor:
        """The positions of this rank's ``s`` tokens of each sequence: 0..s-1, or with context parallelism the
        two chunks the rank holds (platform/context_chunks.py)."""
        cp = self.config.context_parallel_size
        if cp == 1:
            return torch.arange(s, device=device)
        from megatron.core import parallel_state

        from megatron_mtp.platform.context_chunks import local_positions

        rank = parallel_state.get_context_parallel_rank()
        return torch.tensor(local_positions(s, rank, cp), device=device)

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **_):
        q, _ = self.linear_q(hidden_states)
        k_raw, _ = self.linear_k(hidden_states)
        s, b = q.shape[:2]
        q = q.view(s, b, self.heads, self.head_dim)
        k_raw = k_raw.view(s, b, self.groups, self.head_dim)
        v = k_raw if self.linear_v is None else self.linear_v(hidden_states)[0].view(s, b, self.groups, self.head_dim)
        q, k = self.q_layernorm(q), self.k_layernorm(k_raw)
        v = rms_norm(v, torch.ones((), device=v.device), self.eps)
        cos, sin = rope_cos_sin(self.inv_freq, self._positions(s, q.device), q.dtype)
        cos, sin = cos[:, None, None, :], sin[:, None, None, :]
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if self.store_kv:
            self.stored_kv = (k, v)
        out = self.core_attention(q, k, v, attention_mask, attn_mask_type=AttnMaskType.causal)
        out, bias = self.linear_proj(out)
        return self.post_layernorm(out), bias


def attention_tail(module, submodules, layer_number: int, head_dim: int, query_groups: int, left: Optional[int],
                   rope: tuple[float, float], pg_collection, cp_comm_type: Optional[str] = None) -> None:
    """Set on ``module`` what follows its projections: the core attention over the key/value heads of this kind
    (``left`` keys before each query besides its own, None: every earlier one; ``cp_comm_type``: how it runs under
    context parallelism, None: its default), the output projection, the post-attention norm, and the RoPE
    frequencies (base, share) of the kind."""
    config = module.config
    layer_config = copy.copy(config)  # the core attention reads this kind's widths and window
    layer_config.kv_channels, layer_config.num_query_groups = head_dim, query_groups
    layer_config.window_size = None if left is None else (left, 0)
    comm = {} if cp_comm_type is None else {"cp_comm_type": cp_comm_type}
    module.core_attention = submodules.core_attention(
        config=layer_config, layer_number=layer_number, attn_mask_type=AttnMaskType.causal, attention_type="self",
        softmax_scale=1.0, pg_collection=pg_collection, **comm)
    module.linear_proj = submodules.linear_proj(
        config.num_attention_heads * head_dim, config.hidden_size, config=config,
        init_method=config.output_layer_init_method, bias=False, input_is_parallel=True, skip_bias_add=True,
        is_expert=False, tp_comm_buffer_name="proj", tp_group=pg_collection.tp)
    module.post_layernorm = submodules.post_layernorm(config=config, hidden_size=config.hidden_size,
                                                      eps=config.layernorm_epsilon)
    module.register_buffer("inv_freq", rope_inv_freq(head_dim, *rope), persistent=False)
