"""DeepSeek-V3.2 family (DeepSeek-V3's MLA with DeepSeek Sparse Attention's lightning indexer in every
layer, DeepSeek MoE, sequential MTP; megatron-core 0.19's DSA modules): its ``Family``, registered once
(models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.deepseek_v32 import hf_config, hf_mapping, hf_view, sizes
from megatron_mtp.models.deepseek_v32.model_config import DeepseekV32ModelConfig
from megatron_mtp.models.dsa import NEXTN_ARCHITECTURE, serving_notes
from megatron_mtp.models.dsa import sizes as dsa_sizes
from megatron_mtp.models.family import ServingFacts, family_of_modules, register

FAMILY = register(family_of_modules(
    name="deepseek_v32",
    title="DeepSeek-V3.2",
    architectures=(hf_config.ARCHITECTURE,),
    model_types=("deepseek_v32",),
    model_config=DeepseekV32ModelConfig,
    builders="megatron_mtp.models.deepseek_v32",
    sizes=sizes,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
    decoder="megatron_mtp.models.deepseek_v32.decoder:DSADecoderLayer",
    activations="megatron_mtp.models.dsa.activations",
    # transformers 5.25's DeepseekV32ForCausalLM ignores layer 61 (the release's MTP layer)
    serving=ServingFacts(
        transformers_mtp_layers=(61,), mla_head_size=dsa_sizes.mla_head_size,
        index_head_dim=dsa_sizes.index_head_dim, nextn_architecture=NEXTN_ARCHITECTURE,
        notes=("vLLM runs DeepseekV32ForCausalLM with its DeepSeek-V3 model and SGLang with its "
               "DeepseekV32ForCausalLM; every layer runs its own indexer.", *serving_notes("deepseek_v32"))),
))
