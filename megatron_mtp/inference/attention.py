"""The decoder's attention classes, by the attention kind a model family names (``Family.attention``).

Everything else the decoder builds (RMSNorm, RoPE tables, dense MLP, routed MoE, the decoder layer,
the MTP module around it) is shared and reads the family's config.json view through the common
fields of ``models.hf_common.HFView``. A family whose attention is one of these needs nothing here; a
new kind adds its class beside mla.py and gqa.py and one entry below.

The attention class owns its cache layout (``cache_dims``: the named buffers kv_cache.KVCache holds per
position; ``DecoderLayer.new_cache`` builds the cache from it) and its rotary table (``rotary``).
"""

from __future__ import annotations

from typing import Any, Mapping

from megatron_mtp.errors import UserError
from megatron_mtp.inference.gqa import GQAttention
from megatron_mtp.inference.layers import DecoderLayer, Rotary
from megatron_mtp.inference.mla import MLAttention
from megatron_mtp.models.family import Family, family_of_hf_config, hf_family, supported_text
from megatron_mtp.models.hf_common import HFView

ATTENTIONS: dict[str, type] = {"mla": MLAttention, "gqa": GQAttention}
"""Attention kind -> the decoder's class (each takes the family's config.json view)."""


def family_for(raw: Mapping[str, Any], where: Any) -> Family:
    """The family of a config.json dict (models/family.py: the importer reads it as the same family)."""
    family = hf_family(raw)
    if family is None:
        raise UserError(f"{where}: model_type {raw.get('model_type')!r} (architectures "
                        f"{list(raw.get('architectures') or [])}) is not a family megatron-mtp generate decodes; "
                        f"it decodes {supported_text()} exports.")
    return family


def attention_class(config: HFView) -> type:
    """The attention class of the family whose view ``config`` is (by its ``model_type``)."""
    family = family_of_hf_config({"model_type": config.model_type})
    if family.attention not in ATTENTIONS:
        raise UserError(f"model family {family.name} names attention '{family.attention}', which the decoder does "
                        f"not have (it has {', '.join(ATTENTIONS)}); add its class to inference/attention.py")
    return ATTENTIONS[family.attention]


def decoder_layer(config: HFView, layer_index: int) -> DecoderLayer:
    return DecoderLayer(config, layer_index, attention_class(config))


def rotary(config: HFView) -> Rotary:
    return attention_class(config).rotary(config)

