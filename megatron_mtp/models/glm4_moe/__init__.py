"""GLM-4.5 / 4.6 / 4.7 family (``Glm4MoeForCausalLM``): grouped-query attention (models/gqa/) with partial
RoPE and optional q/k norms and qkv bias, DeepSeek-style MoE, DeepSeek-V3-style sequential MTP modules.
Its ``Family``, registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.family import ServingFacts, register
from megatron_mtp.models.glm4_moe import hf_config, hf_view
from megatron_mtp.models.glm4_moe.model_config import Glm4MoeModelConfig
from megatron_mtp.models.gqa import hf_mapping
from megatron_mtp.models.gqa.family import grouped_query_family

FAMILY = register(grouped_query_family(
    name="glm4_moe",
    title="GLM-4.5/4.6/4.7",
    architecture="Glm4MoeForCausalLM",
    model_config=Glm4MoeModelConfig,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
    serving=ServingFacts(
        # transformers 5.24's Glm4MoeForCausalLM knows layers 92 and 46 (the 355B's and the Air's MTP layer)
        transformers_mtp_layers=(92, 46),
        # SGLang's GLM-4.5 NextN module (glm4_moe_nextn.py) runs plain RMSNorms and an nn.Linear eh_proj:
        # none of the fused eh-norm kernel's hidden-size and dtype limits of its DeepSeek-V3 one
        engine_facts={"sglang": dict(draft_hidden_sizes=None, draft_dtypes=None)},
    ),
))
