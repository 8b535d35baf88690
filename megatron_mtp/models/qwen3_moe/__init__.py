"""Qwen3-MoE family (``Qwen3MoeForCausalLM``: Qwen3-30B-A3B, Qwen3-235B-A22B): grouped-query attention
with q/k norms and full RoPE (the shared grouped-query pieces, models/gqa/), softmax top-k routing with
a balance loss and no shared experts, MoE layers by ``decoder_sparse_step`` / ``mlp_only_layers``. The
releases ship no MTP; a draft trained on the frozen base is written in SGLang's Qwen3-MoE MTP naming
(hf_mapping.py). Its ``Family``, registered once (models/family.py)."""

from __future__ import annotations

from megatron_mtp.models.family import ServingFacts, register
from megatron_mtp.models.gqa.family import grouped_query_family
from megatron_mtp.models.qwen3_moe import hf_config, hf_mapping, hf_view
from megatron_mtp.models.qwen3_moe.model_config import Qwen3MoeModelConfig

_NO_MTP = "{engine} has no MTP draft model for Qwen3MoeForCausalLM"

FAMILY = register(grouped_query_family(
    name="qwen3_moe",
    title="Qwen3-MoE",
    architecture="Qwen3MoeForCausalLM",
    model_config=Qwen3MoeModelConfig,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
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
