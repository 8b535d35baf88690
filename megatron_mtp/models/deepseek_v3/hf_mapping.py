"""THE tensor table of the DeepSeek-V3 family: its MLA attention block, around the MoE, dense MLP
and MTP rules every family shares (models/tensor_table.py).

Both conversion directions (convert/to_hf.py, convert/from_hf.py), drop-mtp, the converter's shape
checks (convert/shapes.py), plan's per-rank parameter sizes (plan/params.py) and the analytic
parameter and FLOP counts (size.py) use this table and nothing else, so a new tensor is added in
one place; whether a layer is MoE is decided in models/tensor_table.py (``is_moe_layer``, ``mtp_is_moe``).

The table is built from the typed model config (``ModelConfig``) and the MTP depth. MTP module d
(0-based) is HF layer ``num_hidden_layers + d``; the index always comes from the config.

Parallel MTP heads (``mtp.style: parallel``, models/parallel_heads.py) have no Hugging Face
format; they are exported to their own ``mtp/`` directory (models/parallel_heads_hf.py) as
``heads.{i}.`` + the decoder-layer names of ``model.layers.N.`` (``self_attn.*``, ``mlp.*``, the two
layer norms) and ``heads.{i}.norm.weight`` (the head's final norm); they share the main ``lm_head``.
"""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.models.tensor_table import (  # noqa: F401  (the family's table interface)
    EMBEDDING,
    FINAL_NORM,
    HEAD_NORM,
    MODEL_KEY_PREFIXES,
    MTP_KEY_PREFIXES,
    OUTPUT_LAYER,
    Param,
    Rule,
    Spec,
    Table,
    extra_state_keys,
    hf_head_prefix,
    hidden,
    is_moe_layer,
    is_mtp_hf_name,
    mcore_head_prefix,
    mcore_mtp_prefix,
    moe_layer_count,
    mtp_hf_layer,
    mtp_is_moe,
    mtp_own_rules,
    nextn_name,
)


def _qk(m: ModelConfig) -> int:
    return m.qk_head_dim + m.qk_pos_emb_head_dim


_ATTENTION = (
    Rule("input_layernorm.weight", ("input_layernorm.weight",), hidden, "none", "block_norm"),
    Rule("self_attention.linear_q_down_proj.weight", ("self_attn.q_a_proj.weight",),
         lambda m: (m.q_lora_rank, m.hidden_size), "local"),
    Rule("self_attention.q_layernorm.weight", ("self_attn.q_a_layernorm.weight",),
         lambda m: (m.q_lora_rank,), "none", "norm", spec="local"),
    Rule("self_attention.linear_q_up_proj.layer_norm_weight", ("self_attn.q_a_layernorm.weight",),
         lambda m: (m.q_lora_rank,), "none", "norm", spec="te"),
    Rule("self_attention.linear_q_up_proj.weight", ("self_attn.q_b_proj.weight",),
         lambda m: (m.num_attention_heads * _qk(m), m.q_lora_rank)),
    Rule("self_attention.linear_q_proj.weight", ("self_attn.q_proj.weight",),
         lambda m: (m.num_attention_heads * _qk(m), m.hidden_size)),
    Rule("self_attention.linear_kv_down_proj.weight", ("self_attn.kv_a_proj_with_mqa.weight",),
         lambda m: (m.kv_lora_rank + m.qk_pos_emb_head_dim, m.hidden_size), "local"),
    Rule("self_attention.kv_layernorm.weight", ("self_attn.kv_a_layernorm.weight",),
         lambda m: (m.kv_lora_rank,), "none", "norm", spec="local"),
    Rule("self_attention.linear_kv_up_proj.layer_norm_weight", ("self_attn.kv_a_layernorm.weight",),
         lambda m: (m.kv_lora_rank,), "none", "norm", spec="te"),
    Rule("self_attention.linear_kv_up_proj.weight", ("self_attn.kv_b_proj.weight",),
         lambda m: (m.num_attention_heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank)),
    Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",),
         lambda m: (m.hidden_size, m.num_attention_heads * m.v_head_dim)),
)


def _attention(model: ModelConfig, spec: Optional[Spec]) -> list[Rule]:
    """MLA's tensors: a low-rank query (q_lora_rank set) or a full-rank one."""
    q_lora = model.q_lora_rank is not None
    out = []
    for rule in _ATTENTION:
        if spec is not None and rule.spec not in (None, spec):
            continue
        if q_lora and rule.mcore.startswith("self_attention.linear_q_proj"):
            continue
        if not q_lora and ("q_down" in rule.mcore or "q_up" in rule.mcore or "q_layernorm" in rule.mcore):
            continue
        out.append(rule)
    return out


TABLE = Table(attention=_ATTENTION, attention_for=_attention)
layer_rules = TABLE.layer_rules
block_rules = TABLE.block_rules
rule_for_key = TABLE.rule_for_key
param_table = TABLE.param_table
parallel_head_params = TABLE.parallel_head_params

ATTENTION_ORDER = {
    True: ("input_layernorm.weight", "self_attention.linear_proj.weight",
           "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.layer_norm_weight",
           "self_attention.linear_q_up_proj.weight", "self_attention.linear_q_proj.weight",
           "self_attention.linear_kv_down_proj.weight", "self_attention.linear_kv_up_proj.layer_norm_weight",
           "self_attention.linear_kv_up_proj.weight"),
    False: ("input_layernorm.weight", "self_attention.linear_proj.weight",
            "self_attention.linear_q_down_proj.weight", "self_attention.linear_q_up_proj.weight",
            "self_attention.linear_q_proj.weight", "self_attention.linear_kv_down_proj.weight",
            "self_attention.linear_kv_up_proj.weight", "self_attention.q_layernorm.weight",
            "self_attention.kv_layernorm.weight"),
}
"""The order megatron-core registers an attention block's parameters in (True: TE spec, False: local)."""

