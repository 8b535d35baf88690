"""GLM-4.5 / 4.6 / 4.7 family (``Glm4MoeForCausalLM``): grouped-query attention with partial RoPE and
optional q/k norms and qkv bias, DeepSeek-style MoE, DeepSeek-V3-style sequential MTP modules.

The family interface of models/family.py, loaded lazily so that naming the family imports neither
torch nor megatron-core until a piece is used.
"""

from __future__ import annotations

from megatron_mtp.models.family import lazy_members

_WHERE = {
    "build_transformer_config": "transformer_config", "megatron_layout": "transformer_config",
    "build_model": "model",
    "TABLE": "hf_mapping", "param_table": "hf_mapping", "layer_rules": "hf_mapping", "block_rules": "hf_mapping",
    "mtp_own_rules": "hf_mapping", "HEAD_NORM": "hf_mapping", "is_moe_layer": "hf_mapping",
    "moe_layer_count": "hf_mapping", "mtp_is_moe": "hf_mapping", "ATTENTION_ORDER": "hf_mapping",
    "parameter_counts": "size", "training_flops_per_token": "size", "layer_sizes": "size",
    "mtp_own_size": "size", "kv_cache_elements_per_token": "size", "decode_attention_flops": "size",
    "to_hf_config": "hf_config", "from_hf_config": "hf_config", "carry_source_fields": "hf_config",
}
ATTENTION = "gqa"
"""The attention kind: "mla" (multi-head latent) or "gqa" (grouped-query)."""
HF_ARCHITECTURES = ("Glm4MoeForCausalLM",)
"""What our Hugging Face exports declare (and imports accept)."""
HF_MODEL_TYPES = ("glm4_moe",)
"""config.json ``model_type`` values this family reads."""


__getattr__, __dir__ = lazy_members(__name__, _WHERE, ("ATTENTION", "HF_ARCHITECTURES", "HF_MODEL_TYPES"))
