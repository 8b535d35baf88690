"""Qwen3-MoE's own model fields (``model.family=qwen3_moe`` builds this class): grouped-query attention
with per-head q/k RMSNorms and full RoPE, and where the routed layers are (``decoder_sparse_step``,
``mlp_only_layers``). The routing itself (softmax top-k, ``router_norm_topk_prob``, the balance loss,
no expert bias, no groups, no shared experts) is the shared ModelConfig's.

The attention is the shared grouped-query attention (models/gqa/) with two settings fixed: every head
dimension is rotated and there is no qkv bias (transformers' Qwen3-MoE puts ``attention_bias`` on o_proj
too, which megatron-core's linear_proj does not have, and the released models have none). They are class
constants here, not fields, so the shared pieces (tensor table, sizes, megatron-core config, GPTModel)
read them as they read GLM's fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional

from megatron_mtp.config.moe_layers import MoeLayers
from megatron_mtp.errors import UserError
from megatron_mtp.models.gqa.model_config import GroupedQueryModelConfig
from megatron_mtp.models.gqa.model_config import check as check_grouped_query
from megatron_mtp.models.softmax_routing import SoftmaxRouting


@dataclass
class Qwen3MoeModelConfig(SoftmaxRouting, GroupedQueryModelConfig):  # the routing defaults win (the later base)
    rotary_percent: ClassVar[float] = 1.0
    """Qwen3 rotates every dimension of each head (rotate-half style)."""
    add_qkv_bias: ClassVar[bool] = False
    """Qwen3-MoE has no attention bias."""

    # Qwen3-MoE's routing: the softmax-routed families' defaults (models/softmax_routing.py)

    head_dim: Optional[int] = None
    """Width of each query/key/value head (HF head_dim; Qwen3-MoE's is 128 whatever the hidden size).
    null: hidden_size / num_attention_heads."""
    qk_layernorm: bool = True
    """An RMSNorm of width head_dim on each query and key head before RoPE (always on in Qwen3)."""
    decoder_sparse_step: int = 1
    """Routed MLP on every step-th layer, counted from 1: layer i (0-based) is MoE when (i + 1) % step == 0
    (HF decoder_sparse_step; 1: every layer)."""
    mlp_only_layers: list[int] = field(default_factory=list)
    """0-based decoder layers that keep a dense MLP (of ffn_hidden_size) whatever decoder_sparse_step says
    (HF mlp_only_layers); model.first_k_dense makes the first k layers dense as well."""

    def moe_layer_rule(self) -> MoeLayers:
        step = self.decoder_sparse_step
        return MoeLayers(self.num_layers, self.num_experts, self.first_k_dense, every=step, phase=step - 1,
                         dense=frozenset(self.mlp_only_layers), mtp_index=0)  # SGLang's draft: its layer 0

    def check(self, cfg: Any) -> None:
        check(cfg)


def check(cfg) -> None:
    """One sentence for the first Qwen3-MoE field the model or the layout cannot take."""
    m = cfg.model
    check_grouped_query(cfg)
    if m.decoder_sparse_step < 1:
        raise UserError(f"model.decoder_sparse_step is {m.decoder_sparse_step}; it must be a positive integer "
                        "(1: every layer is MoE)")
    outside = [i for i in m.mlp_only_layers if not 0 <= i < m.num_layers]
    if outside:
        raise UserError(f"model.mlp_only_layers names layer {outside[0]}, but the model's layers are 0 to "
                        f"{m.num_layers - 1}; list 0-based indices of model.num_layers={m.num_layers} layers")
    if len(set(m.mlp_only_layers)) != len(m.mlp_only_layers):
        raise UserError(f"model.mlp_only_layers {m.mlp_only_layers} names a layer twice; list each layer once")
