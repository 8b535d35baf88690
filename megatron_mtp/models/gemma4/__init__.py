"""Gemma 4 family (``Gemma4ForCausalLM``; the text model of ``Gemma4ForConditionalGeneration``): sliding-window
and full attention interleaved with per-kind head widths, keys reused as values on the full layers,
sandwich norms, a dense GELU-tanh MLP beside a softmax top-k MoE block in every layer, a sqrt(hidden)-scaled
tied embedding and soft-capped logits. megatron-core has no module for most of that, so the family brings
its own through the spec system (attention.py, feed_forward.py, specs.py, model.py). Its ``Family``,
registered once (models/family.py); the megatron-core pieces load when first used."""

from __future__ import annotations

from megatron_mtp.models.family import ServingFacts, family_of_modules, register
from megatron_mtp.models.gemma4 import hf_config, hf_config_json, hf_mapping, size
from megatron_mtp.models.gemma4.model_config import Gemma4ModelConfig

FAMILY = register(family_of_modules(
    name="gemma4",
    title="Gemma 4",
    architectures=("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"),
    model_types=("gemma4_text", "gemma4"),
    model_config=Gemma4ModelConfig,
    builders="megatron_mtp.models.gemma4",
    size=size,
    hf_mapping=hf_mapping,
    hf_config=hf_config,
    hf_config_json=hf_config_json,
    attention="gemma4",
    serving=ServingFacts(),
))
