"""Which model family an export is, and what the decoder builds for it.

A family is picked from config.json's ``model_type`` (or, without one, its ``architectures``). It
gives the typed view of config.json and the attention class; everything else (RMSNorm, RoPE tables,
dense MLP, sigmoid-routed MoE, the decoder layer, the MTP module around it) is shared:

| family | model_type / architecture | config view (``models/...``) | attention |
|---|---|---|---|
| DeepSeek-V3 | ``deepseek_v3`` / ``DeepseekV3ForCausalLM`` | ``deepseek_v3/hf_config_json.py`` | MLA (mla.py) |
| GLM-4.5 | ``glm4_moe`` / ``Glm4MoeForCausalLM`` | ``glm4_moe/hf_config_json.py`` | GQA (gqa.py) |

The attention class owns its cache layout (``cache_dims``: the named buffers kv_cache.KVCache holds per
position; ``DecoderLayer.new_cache`` builds the cache from it) and its rotary table (``rotary``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

from megatron_mtp.errors import UserError
from megatron_mtp.inference.gqa import GQAttention
from megatron_mtp.inference.layers import DecoderLayer, HFConfig, Rotary
from megatron_mtp.inference.mla import MLAttention
from megatron_mtp.models.deepseek_v3.hf_config_json import DeepseekV3HFConfig
from megatron_mtp.models.deepseek_v3.hf_config_json import parse_hf_config as parse_deepseek_v3
from megatron_mtp.models.family import hf_family_name
from megatron_mtp.models.glm4_moe.hf_config_json import Glm4MoeHFConfig
from megatron_mtp.models.glm4_moe.hf_config_json import parse_hf_config as parse_glm4_moe


@dataclass(frozen=True)
class InferenceFamily:
    """One model family as the decoder sees it."""

    model_type: str
    architectures: tuple[str, ...]
    config_class: type
    parse: Callable[[Mapping[str, Any], str], Any]
    """config.json dict, where → the typed view (a UserError for a bad field)."""
    attention: type[MLAttention] | type[GQAttention]

    def decoder_layer(self, config: HFConfig, layer_index: int) -> DecoderLayer:
        return DecoderLayer(config, layer_index, self.attention)

    def rotary(self, config: HFConfig) -> Rotary:
        return self.attention.rotary(config)  # type: ignore[arg-type]


DEEPSEEK_V3 = InferenceFamily("deepseek_v3", ("DeepseekV3ForCausalLM",),
                              DeepseekV3HFConfig, parse_deepseek_v3, MLAttention)
GLM4_MOE = InferenceFamily("glm4_moe", ("Glm4MoeForCausalLM",),
                           Glm4MoeHFConfig, parse_glm4_moe, GQAttention)
FAMILIES = (DEEPSEEK_V3, GLM4_MOE)
SUPPORTED = "DeepSeek-V3 (model_type deepseek_v3) and GLM-4.5/4.6/4.7 (model_type glm4_moe)"
"""The families, as messages list them."""


def family_for(raw: Mapping[str, Any], where: str | Path) -> InferenceFamily:
    """The family of a config.json dict: by ``model_type``, else by ``architectures`` (models/family.py)."""
    model_type = raw.get("model_type")
    architectures = raw.get("architectures") or []
    name = hf_family_name(raw)  # models/family.py: the importer reads the file as the same family
    for family in FAMILIES:
        if family.model_type == name:
            return family
    raise UserError(f"{where}: model_type {model_type!r} (architectures {list(architectures)}) is not a family "
                    f"megatron-mtp generate decodes; it decodes {SUPPORTED} exports.")


def family_of(config: HFConfig) -> InferenceFamily:
    """The family whose config view ``config`` is."""
    for family in FAMILIES:
        if isinstance(config, family.config_class):
            return family
    raise TypeError(f"no decoder family reads {type(config).__name__}")
