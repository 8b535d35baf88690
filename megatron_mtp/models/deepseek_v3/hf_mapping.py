"""THE tensor table of the DeepSeek-V3 family: its MLA attention block, around the MoE, dense MLP
and MTP rules every family shares (models/tensor_table.py).

Both conversion directions (convert/to_hf.py, convert/from_hf.py), drop-mtp, the converter's shape
checks (convert/shapes.py), plan's per-rank parameter sizes (plan/params.py) and the analytic
parameter and FLOP counts (size.py) use this table and nothing else, so a new tensor is added in
one place; whether a layer is MoE is decided in models/tensor_table.py (``is_moe_layer``, ``mtp_is_moe``).

The table is built from the typed model config (``ModelConfig``) and the MTP depth. MTP module d
(0-based) is HF layer ``num_hidden_layers + d``; the index always comes from the config.

Parallel MTP heads (``mtp.style: parallel``, mtp_styles/parallel/model.py) have no Hugging Face
format; they are exported to their own ``mtp/`` directory (mtp_styles/parallel/hf_format.py) as
``heads.{i}.`` + the decoder-layer names of ``model.layers.N.`` (``self_attn.*``, ``mlp.*``, the two
layer norms) and ``heads.{i}.norm.weight`` (the head's final norm); they share the main ``lm_head``.
"""

from __future__ import annotations

from megatron_mtp.models.mla.attention_table import ATTENTION_ORDER, MLA_RULES, mla_attention  # noqa: F401
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

TABLE = Table(attention=MLA_RULES, attention_for=mla_attention)
layer_rules = TABLE.layer_rules
block_rules = TABLE.block_rules
rule_for_key = TABLE.rule_for_key
param_table = TABLE.param_table
parallel_head_params = TABLE.parallel_head_params
