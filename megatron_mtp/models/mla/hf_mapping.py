"""Multi-head latent attention's tensor rules, which the MLA families share (DeepSeek-V3's table is these
around the shared MLP and MTP rules; DeepSeek-V3.2 adds its indexer's): megatron-core key, Hugging Face
name, global shape, tensor-parallel split, role, TE/local spelling; and the order megatron-core registers
them in (``ATTENTION_ORDER``, for ``plan``)."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.models.tensor_table import Rule, Spec, hidden


def _qk(m: ModelConfig) -> int:
    return m.qk_head_dim + m.qk_pos_emb_head_dim


MLA_RULES = (
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


def mla_attention(model: ModelConfig, spec: Optional[Spec]) -> list[Rule]:
    """MLA's tensors: a low-rank query (q_lora_rank set) or a full-rank one."""
    q_lora = model.q_lora_rank is not None
    out = []
    for rule in MLA_RULES:
        if spec is not None and rule.spec not in (None, spec):
            continue
        if q_lora and rule.mcore.startswith("self_attention.linear_q_proj"):
            continue
        if not q_lora and ("q_down" in rule.mcore or "q_up" in rule.mcore or "q_layernorm" in rule.mcore):
            continue
        out.append(rule)
    return out


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

