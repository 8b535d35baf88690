"""GLM-4.5 / 4.6 / 4.7 family (``Glm4MoeForCausalLM``): grouped-query attention with partial RoPE and
optional q/k norms and qkv bias, DeepSeek-style MoE, DeepSeek-V3-style sequential MTP modules. Its
``Family``, registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.family import Family, ServingFacts, lazy, register
from megatron_mtp.models.glm4_moe import hf_config, hf_config_json, hf_mapping, size
from megatron_mtp.models.glm4_moe.model_config import Glm4MoeModelConfig

FAMILY = register(Family(
    name="glm4_moe",
    title="GLM-4.5/4.6/4.7",
    hf_architectures=("Glm4MoeForCausalLM",),
    hf_model_types=("glm4_moe",),
    model_config=Glm4MoeModelConfig,
    table=hf_mapping.TABLE,
    attention_order=hf_mapping.ATTENTION_ORDER,
    attention_shape=size.attention_shape,
    build_transformer_config=lazy("megatron_mtp.models.glm4_moe.transformer_config:build_transformer_config"),
    build_model=lazy("megatron_mtp.models.glm4_moe.model:build_model"),
    layer_sizes=size.layer_sizes,
    parameter_counts=size.parameter_counts,
    training_flops_per_token=size.training_flops_per_token,
    kv_cache_elements_per_token=size.kv_cache_elements_per_token,
    decode_attention_flops=size.decode_attention_flops,
    to_hf_config=hf_config.to_hf_config,
    from_hf_config=hf_config.from_hf_config,
    carry_source_fields=hf_config.carry_source_fields,
    hf_view=hf_config_json.parse_hf_config,
    attention="gqa",
    serving=ServingFacts(
        # transformers 5.24's Glm4MoeForCausalLM knows layers 92 and 46 (the 355B's and the Air's MTP layer)
        transformers_mtp_layers=(92, 46),
        # SGLang's GLM-4.5 NextN module (glm4_moe_nextn.py) runs plain RMSNorms and an nn.Linear eh_proj:
        # none of the fused eh-norm kernel's hidden-size and dtype limits of its DeepSeek-V3 one
        engine_facts={"sglang": dict(draft_hidden_sizes=None, draft_dtypes=None)},
    ),
))
