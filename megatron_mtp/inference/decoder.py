"""The decoder layer of a family (``Family.decoder_layer``) and the family of an export.

A family names its decoder-layer class: one of the shared ones around an attention kind several families use
(models/decoding/: ``MLADecoderLayer``, ``GQADecoderLayer``, each the shared DecoderLayer — RMSNorm, RoPE
tables, dense MLP, routed MoE — reading the family's config.json view through the common fields of
``models.hf_common.HFView``), or its own where its whole layer differs (Gemma 4: models/gemma4/decoder.py,
sandwich norms, a dense MLP beside the experts, per-layer attention kinds with their own RoPE). The class
takes (config view, layer index), owns its attention and cache layout (``new_cache``), and says which rotary
table the model computes once per forward for all its layers (``rotary``; None: each layer applies its own).
"""

from __future__ import annotations

from typing import Any, Mapping

from megatron_mtp.errors import UserError
from megatron_mtp.models.decoding.layers import Rotary
from megatron_mtp.models.family import Family, family_of_hf_config, hf_family, supported_text
from megatron_mtp.models.hf_common import HFView


def family_for(raw: Mapping[str, Any], where: Any) -> Family:
    """The family of a config.json dict (models/family.py: the importer reads it as the same family)."""
    family = hf_family(raw)
    if family is None:
        raise UserError(f"{where}: model_type {raw.get('model_type')!r} (architectures "
                        f"{list(raw.get('architectures') or [])}) is not a family megatron-mtp generate decodes; "
                        f"it decodes {supported_text(decoding=True)} exports.")
    return family


def layer_class(config: HFView) -> type:
    """The decoder-layer class of the family whose view ``config`` is (by its ``model_type``)."""
    return family_of_hf_config({"model_type": config.model_type}).decoder_layer()


def decoder_layer(config: HFView, layer_index: int):
    return layer_class(config)(config, layer_index)


_OVER: dict[tuple[type, type], type] = {}


def over_decoder_layer(parts: type, config: HFView, layer_index: int, *args, **kwargs):
    """An instance of ``parts`` (a mixin that adds its own modules in ``_init_parts(config, *args, **kwargs)``)
    over the family's decoder layer ``layer_index``; ``layer_forward`` is that layer's forward. An MTP module
    (mtp_module.py) and a parallel head (mtp_styles/parallel/drafter.py) are built so. The class is made once per
    (parts, layer class)."""
    layer = layer_class(config)
    cls = _OVER.get((parts, layer))
    if cls is None:
        def __init__(self, config: HFView, layer_index: int, *args, **kwargs) -> None:
            layer.__init__(self, config, layer_index)
            self._init_parts(config, *args, **kwargs)

        cls = _OVER[(parts, layer)] = type(f"{layer.__name__}{parts.__name__}", (parts, layer),
                                           {"__init__": __init__, "layer_forward": layer.forward})
    return cls(config, layer_index, *args, **kwargs)


def rotary(config: HFView) -> Rotary | None:
    """The rotary table the model computes once per forward for every layer; None where each layer applies its
    own."""
    return layer_class(config).rotary(config)
