"""DeepSeek-V3 family (MLA attention, DeepSeek MoE, sequential MTP modules or parallel heads): its
``Family``, registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.deepseek_v3 import hf_config, hf_config_json, hf_mapping, size
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig
from megatron_mtp.models.family import Family, ServingFacts, lazy, register

FAMILY = register(Family(
    name="deepseek_v3",
    title="DeepSeek-V3",
    hf_architectures=("DeepseekV3ForCausalLM",),
    hf_model_types=("deepseek_v3", "deepseek_v2"),
    model_config=DeepseekV3ModelConfig,
    table=hf_mapping.TABLE,
    attention_order=hf_mapping.ATTENTION_ORDER,
    attention_shape=size.attention_shape,
    build_transformer_config=lazy("megatron_mtp.models.deepseek_v3.transformer_config:build_transformer_config"),
    build_model=lazy("megatron_mtp.models.deepseek_v3.model:build_model"),
    layer_sizes=size.layer_sizes,
    parameter_counts=size.parameter_counts,
    training_flops_per_token=size.training_flops_per_token,
    kv_cache_elements_per_token=size.kv_cache_elements_per_token,
    decode_attention_flops=size.decode_attention_flops,
    to_hf_config=hf_config.to_hf_config,
    from_hf_config=hf_config.from_hf_config,
    carry_source_fields=hf_config.carry_source_fields,
    hf_view=hf_config_json.parse_hf_config,
    attention="mla",
    # transformers 5.24's DeepseekV3ForCausalLM knows layer 61 (the release's MTP layer); MLA caches
    # one latent + rotary key per token: the "head size" of vLLM's MLA kernels
    serving=ServingFacts(transformers_mtp_layers=(61,), mla_head_size=size.kv_cache_elements_per_token),
))
