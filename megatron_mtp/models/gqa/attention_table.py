"""The grouped-query attention block's tensor rules, and the table of a GQA family that names its MTP
layers as DeepSeek-V3 does (GLM-4.5): around the MoE, dense MLP and MTP rules every family shares
(models/tensor_table.py). A family with its own MTP naming builds its Table from these rules
(models/qwen3_moe/hf_mapping.py).

megatron-core fuses q, k and v into one ``linear_qkv`` whose rows are grouped per key/value head:
[group g: its query heads, its key head, its value head] for g = 0 .. groups-1 (so a TP rank holds
whole groups); the optional bias follows the same rows. Transformer Engine fuses the layer's input
norm into it (``linear_qkv.layer_norm_weight``); the local spec keeps ``input_layernorm`` and its
checkpoint key is renamed to TE's (models/megatron_specs.py). The per-head q/k norms (``use_qk_norm``)
are ``q_layernorm``/``k_layernorm`` in both specs. The MTP layer is HF layer ``num_hidden_layers + d``
with DeepSeek-V3's sub-names (``enorm``, ``hnorm``, ``eh_proj``, ``shared_head``).
"""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.models.gqa.model_fields import head_dim, query_groups
from megatron_mtp.models.tensor_table import (  # noqa: F401  (the family's table interface)
    EMBEDDING,
    FINAL_NORM,
    HEAD_NORM,
    OUTPUT_LAYER,
    Param,
    Rule,
    Spec,
    Table,
    extra_state_keys,
    hidden,
    is_moe_layer,
    is_mtp_hf_name,
    moe_layer_count,
    mtp_is_moe,
    mtp_own_rules,
    nextn_name,
)


def _qkv_rows(m: ModelConfig) -> int:
    return (m.num_attention_heads + 2 * query_groups(m)) * head_dim(m)


def qkv_layout(m: ModelConfig) -> tuple[int, int, int]:
    """(groups, query heads per group, head dim) of ``linear_qkv``'s rows."""
    return query_groups(m), m.num_attention_heads // query_groups(m), head_dim(m)


_QKV = ("self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight")
ATTENTION_RULES = (
    Rule("input_layernorm.weight", ("input_layernorm.weight",), hidden, "none", "block_norm", spec="local"),
    Rule("self_attention.linear_qkv.layer_norm_weight", ("input_layernorm.weight",), hidden, "none", "block_norm",
         spec="te"),
    Rule("self_attention.linear_qkv.weight", _QKV, lambda m: (_qkv_rows(m), m.hidden_size), fuse="qkv"),
    Rule("self_attention.linear_qkv.bias", tuple(n.replace(".weight", ".bias") for n in _QKV),
         lambda m: (_qkv_rows(m),), fuse="qkv"),
    Rule("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), lambda m: (head_dim(m),), "none", "norm"),
    Rule("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), lambda m: (head_dim(m),), "none", "norm"),
    Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",),
         lambda m: (m.hidden_size, m.num_attention_heads * head_dim(m))),
)


def attention_rules(model: ModelConfig, spec: Optional[Spec]) -> list[Rule]:
    """The grouped-query attention's tensors: the bias and the q/k norms only where configured."""
    out = []
    for rule in ATTENTION_RULES:
        if spec is not None and rule.spec not in (None, spec):
            continue
        if rule.mcore.endswith(".bias") and not model.add_qkv_bias:
            continue
        if "k_layernorm" in rule.mcore or "q_layernorm" in rule.mcore:
            if not model.qk_layernorm:
                continue
        out.append(rule)
    return out


TABLE = Table(attention=ATTENTION_RULES, attention_for=attention_rules, qkv=qkv_layout)
layer_rules = TABLE.layer_rules
block_rules = TABLE.block_rules
rule_for_key = TABLE.rule_for_key
param_table = TABLE.param_table

ATTENTION_ORDER = {
    True: ("self_attention.linear_proj.weight", "self_attention.linear_qkv.layer_norm_weight",
           "self_attention.linear_qkv.weight", "self_attention.linear_qkv.bias",
           "self_attention.q_layernorm.weight", "self_attention.k_layernorm.weight"),
    False: ("input_layernorm.weight", "self_attention.linear_proj.weight", "self_attention.linear_qkv.weight",
            "self_attention.linear_qkv.bias", "self_attention.q_layernorm.weight",
            "self_attention.k_layernorm.weight"),
}
"""The order megatron-core registers an attention block's parameters in (True: TE spec, False: local)."""
