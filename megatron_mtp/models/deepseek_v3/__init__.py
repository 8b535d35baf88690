"""DeepSeek-V3 family (MLA attention, DeepSeek MoE, sequential MTP modules or parallel heads): its
``Family``, registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.deepseek_v3 import hf_config, hf_mapping, hf_view, sizes
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig
from megatron_mtp.models.family import ServingFacts, family_of_modules, register

FAMILY = register(family_of_modules(
    name="deepseek_v3",
    title="DeepSeek-V3",
    architectures=("DeepseekV3ForCausalLM",),
    model_types=("deepseek_v3", "deepseek_v2"),
    model_config=DeepseekV3ModelConfig,
    builders="megatron_mtp.models.deepseek_v3",
    sizes=sizes,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
    decoder="megatron_mtp.models.decoding.mla:MLADecoderLayer",
    activations="megatron_mtp.models.mla.activations",
    # transformers 5.24's DeepseekV3ForCausalLM knows layer 61 (the release's MTP layer); MLA caches
    # one latent + rotary key per token: the "head size" of vLLM's MLA kernels
    serving=ServingFacts(transformers_mtp_layers=(61,), mla_head_size=sizes.kv_cache_elements_per_token),
))
