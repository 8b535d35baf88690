"""Qwen3-MoE family (``Qwen3MoeForCausalLM``: Qwen3-30B-A3B, Qwen3-235B-A22B): grouped-query attention
with q/k norms and full RoPE (GLM-4.5's attention pieces, models/glm4_moe/), softmax top-k routing with
a balance loss and no shared experts, MoE layers by ``decoder_sparse_step`` / ``mlp_only_layers``. The
releases ship no MTP; a draft trained on the frozen base is written in SGLang's Qwen3-MoE MTP naming
(hf_mapping.py). Its ``Family``, registered once (models/family.py)."""

from __future__ import annotations

from megatron_mtp.models.family import Family, ServingFacts, lazy, register
from megatron_mtp.models.glm4_moe import size
from megatron_mtp.models.qwen3_moe import hf_config, hf_config_json, hf_mapping
from megatron_mtp.models.qwen3_moe.model_config import Qwen3MoeModelConfig

_NO_MTP = "{engine} has no MTP draft model for Qwen3MoeForCausalLM"

FAMILY = register(Family(
    name="qwen3_moe",
    title="Qwen3-MoE",
    hf_architectures=("Qwen3MoeForCausalLM",),
    hf_model_types=("qwen3_moe",),
    model_config=Qwen3MoeModelConfig,
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
        engine_facts={
            # vLLM's MTP model types (deepseek_mtp, glm4_moe_mtp, qwen3_next_mtp, ... in the sources read) have
            # none for qwen3_moe, and its Qwen3MoeForCausalLM loads through AutoWeightsLoader, which refuses a
            # name (mtp.*) it has no module for
            "vllm": dict(no_draft=_NO_MTP.format(engine="vLLM"), skips_mtp_in_main=False),
            # SGLang's Qwen3MoeForCausalLMMTP (qwen3_moe_mtp.py): mtp.* names from the target's directory (or
            # --speculative-draft-model-path), one module applied per step, plain RMSNorms and nn.Linear fc
            "sglang": dict(draft_layouts=("inline", "separate"), one_layer_draft_layouts=("inline", "separate"),
                           max_depth=None, draft_hidden_sizes=None, draft_dtypes=None),
            # transformers 5's Qwen3MoeForCausalLM has no MTP layer (generate(use_mtp=True) is DeepSeek/GLM's)
            "transformers": dict(no_draft=_NO_MTP.format(engine="transformers")),
        },
        notes=("SGLang's Qwen3MoeForCausalLMMTP reads the MTP module under `mtp.*` (the Qwen3-Next naming) and "
               "applies it once per draft step; a module d >= 1 (`mtp.{d}.*`) is read by "
               "`megatron-mtp generate` alone.",),
    ),
))
