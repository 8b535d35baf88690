"""GLM-5 family (``glm_moe_dsa``: MLA with DeepSeek Sparse Attention's lightning indexer, IndexShare across
layers, dense first layers, DeepSeek-style MoE with one routing group, sequential MTP; megatron-core 0.19's DSA
modules): its ``Family``, registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.dsa import NEXTN_ARCHITECTURE, serving_notes
from megatron_mtp.models.dsa import sizes as dsa_sizes
from megatron_mtp.models.family import ServingFacts, family_of_modules, register
from megatron_mtp.models.glm_moe_dsa import hf_config, hf_mapping, hf_view, sizes
from megatron_mtp.models.glm_moe_dsa.model_config import GlmMoeDsaModelConfig

FAMILY = register(family_of_modules(
    name="glm_moe_dsa",
    title="GLM-5",
    architectures=(hf_config.ARCHITECTURE,),
    model_types=("glm_moe_dsa",),
    model_config=GlmMoeDsaModelConfig,
    builders="megatron_mtp.models.glm_moe_dsa",
    sizes=sizes,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
    decoder="megatron_mtp.models.glm_moe_dsa.decoder:DSADecoderLayer",
    activations="megatron_mtp.models.dsa.activations",
    # transformers 5.25's GlmMoeDsaForCausalLM ignores layer 78 (the release's MTP layer)
    serving=ServingFacts(
        transformers_mtp_layers=(78,), mla_head_size=sizes.mla_head_size,
        index_head_dim=dsa_sizes.index_head_dim, nextn_architecture=NEXTN_ARCHITECTURE,
        notes=("vLLM and SGLang run GlmMoeDsaForCausalLM with their DeepSeek-V2 model. vLLM reads IndexShare from "
               "index_topk_freq and index_skip_topk_offset (or index_topk_pattern), not from indexer_types, and builds "
               "no indexer in a layer that reuses a top-k; the export writes both fields, which give the same "
               "layers as indexer_types.", *serving_notes("glm_moe_dsa"),
               "transformers' GlmMoeDsaForCausalLM normalises the query and key/value latents with eps 1e-6 whatever "
               "rms_norm_eps says (1e-5 in GLM-5), where megatron-core, vLLM and SGLang take rms_norm_eps, so its "
               "logits differ slightly from ours and the engines'.")),
))
