"""Gemma 4 family (``Gemma4ForCausalLM``; the text model of ``Gemma4ForConditionalGeneration``): sliding-window
and full attention interleaved with per-kind head widths, keys reused as values on the full layers,
sandwich norms, a dense GELU-tanh MLP beside a softmax top-k MoE block in every layer, a sqrt(hidden)-scaled
tied embedding and soft-capped logits. megatron-core has no module for most of that, so the family brings
its own through the spec system (attention.py, feed_forward.py, specs.py, model.py). Its ``Family``,
registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.family import ServingFacts, family_of_modules, register
from megatron_mtp.models.gemma4 import hf_config, hf_mapping, hf_view, sizes
from megatron_mtp.models.gemma4.model_config import Gemma4ModelConfig

_NO_MTP = "{engine} has no DeepSeek-style MTP draft model for Gemma4ForCausalLM"

FAMILY = register(family_of_modules(
    name="gemma4",
    title="Gemma 4",
    architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    model_types=("gemma4_text", "gemma4"),
    model_config=Gemma4ModelConfig,
    builders="megatron_mtp.models.gemma4",
    sizes=sizes,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_view=hf_view,
    decoder="megatron_mtp.models.gemma4.decoder:Gemma4DecoderLayer",
    activations="megatron_mtp.models.gemma4.activations",
    style_packages={"assistant": "megatron_mtp.models.gemma4.assistant"},  # its separate drafter
    serving=ServingFacts(
        engine_facts={
            # The engines serve Gemma 4's own drafter (the assistant model), not a DeepSeek-style MTP module: none of
            # them loads ours, so an export for them is the main model alone (layer names past num_hidden_layers would
            # be refused by their loaders); their Gemma 4 loaders tie lm_head to the embedding, as every release is
            "vllm": dict(no_draft=_NO_MTP.format(engine="vLLM"), skips_mtp_in_main=False, loads_tied_head=True),
            "sglang": dict(no_draft=_NO_MTP.format(engine="SGLang"), skips_mtp_in_main=False, loads_tied_head=True),
            "transformers": dict(no_draft=_NO_MTP.format(engine="transformers")),
        },
        no_fp8_export="its release format has no FP8 weights (Google ships bf16; the engines quantise at load)",
        notes=("Gemma 4's MTP modules (DeepSeek-style, trained here) are drafted by `megatron-mtp generate` alone; "
               "the engines draft Gemma 4 with its assistant model.",),
    ),
))
