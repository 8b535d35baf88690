"""The decoder's attention classes, by the attention kind a model family names (``Family.attention``).

Everything else the decoder builds (RMSNorm, RoPE tables, dense MLP, routed MoE, the decoder layer,
the MTP module around it) is shared and reads the family's config.json view through the common
fields of ``models.hf_common.HFView``. A family whose attention is one of these needs nothing here; a
new kind adds its class beside mla.py and gqa.py and one entry below.

A family whose whole decoder layer differs (Gemma 4: sandwich norms, a dense MLP beside the experts,
per-layer attention kinds with their own RoPE) names a layer class in ``LAYERS`` instead; it takes
(config view, layer index) and owns its attention, its cache layout and its rotary tables.

The attention class owns its cache layout (``cache_dims``: the named buffers kv_cache.KVCache holds per
position; ``DecoderLayer.new_cache`` builds the cache from it) and its rotary table (``rotary``).
"""

from __future__ import annotations

from typing import Any, Mapping

from megatron_mtp.errors import UserError
from megatron_mtp.inference.gemma4 import Gemma4DecoderLayer
from megatron_mtp.inference.gqa import GQAttention
from megatron_mtp.inference.layers import DecoderLayer, Rotary
from megatron_mtp.inference.mla import MLAttention
from megatron_mtp.models.family import Family, family_of_hf_config, hf_family, supported_text
from megatron_mtp.models.hf_common import HFView

ATTENTIONS: dict[str, type] = {"mla": MLAttention, "gqa": GQAttention}
"""Attention kind -> the decoder's class (each takes the family's config.json view)."""
LAYERS: dict[str, type] = {"gemma4": Gemma4DecoderLayer}
"""Attention kind -> a whole decoder-layer class of its own (module note)."""


def family_for(raw: Mapping[str, Any], where: Any) -> Family:
    """The family of a config.json dict (models/family.py: the importer reads it as the same family)."""
    family = hf_family(raw)
    if family is None:
        raise UserError(f"{where}: model_type {raw.get('model_type')!r} (architectures "
                        f"{list(raw.get('architectures') or [])}) is not a family megatron-mtp generate decodes; "
                        f"it decodes {supported_text()} exports.")
    return family


def _kind(config: HFView) -> str:
    return family_of_hf_config({"model_type": config.model_type}).attention


def layer_class(config: HFView) -> type | None:
    """The family's own decoder-layer class (``LAYERS``), or None where the shared DecoderLayer serves."""
    return LAYERS.get(_kind(config))


def attention_class(config: HFView) -> type:
    """The attention class of the family whose view ``config`` is (by its ``model_type``)."""
    family = family_of_hf_config({"model_type": config.model_type})
    if family.attention not in ATTENTIONS:
        raise UserError(f"model family {family.name} names attention '{family.attention}', which the decoder does "
                        f"not have (it has {', '.join(ATTENTIONS)}); add its class to inference/attention.py")
    return ATTENTIONS[family.attention]


def decoder_layer(config: HFView, layer_index: int):
    own = layer_class(config)
    return own(config, layer_index) if own is not None else DecoderLayer(config, layer_index, attention_class(config))


_OVER: dict[tuple[type, type], type] = {}


def over_decoder_layer(parts: type, config: HFView, layer_index: int, *args, **kwargs):
    """An instance of ``parts`` (a mixin that adds its own modules in ``_init_parts(config, *args, **kwargs)``)
    over the family's decoder layer ``layer_index``: its own layer class (``LAYERS``), or the shared DecoderLayer
    with its attention class; ``layer_forward`` is that layer's forward. An MTP module (mtp_module.py) and a
    parallel head (parallel_draft.py) are built so. The class is made once per (parts, layer class)."""
    own = layer_class(config)
    layer = own or DecoderLayer
    cls = _OVER.get((parts, layer))
    if cls is None:
        def __init__(self, config: HFView, layer_index: int, *args, **kwargs) -> None:
            if own is None:
                DecoderLayer.__init__(self, config, layer_index, attention_class(config))
            else:
                own.__init__(self, config, layer_index)
            self._init_parts(config, *args, **kwargs)

        cls = _OVER[(parts, layer)] = type(f"{layer.__name__}{parts.__name__}", (parts, layer),
                                           {"__init__": __init__, "layer_forward": layer.forward})
    return cls(config, layer_index, *args, **kwargs)


def rotary(config: HFView) -> Rotary | None:
    """The rotary table the model computes once per forward for every layer; None where each layer kind
    applies its own (``LAYERS``)."""
    return None if layer_class(config) is not None else attention_class(config).rotary(config)

