"""Our model config <-> a Hugging Face DSA model's config, both ways, for every DSA family: DeepSeek-V3's
conversion (models/mla/hf_config.py: MLA, routing, YaRN, its refusals) and the indexer's fields; a family
names its view, its model class and architecture, and gives its own fields. transformers writes
``mlp_layer_types``/``layer_types`` too; the view checks them and an export leaves them to transformers'
defaults, which give the same lists."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.dsa.hf_view import INDEX_KEYS, LIST_KEYS, DSAHFConfig
from megatron_mtp.models.dsa.model_fields import DSAModelConfig
from megatron_mtp.models.mla import hf_config as v3

NOT_CARRIED = {
    **v3.NOT_CARRIED,
    "mlp_layer_types": "transformers derives it from first_k_dense_replace",
    "layer_types": "transformers derives it (indexed attention in every layer)",
}


def to_hf_config(model: DSAModelConfig, mtp: MTPConfig, view: type, architecture: str, own: Mapping[str, Any],
                 **kwargs) -> DSAHFConfig:
    """The ``view`` (the family's config.json) of a model with this architecture, with the family's ``own``
    fields (keywords as DeepSeek-V3's ``to_hf_config``)."""
    base = v3.to_hf_config(model, mtp, **kwargs)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(architectures=(architecture,), model_type=view.__dataclass_fields__["model_type"].default)
    return view(**fields, **{k: getattr(model, k) for k in INDEX_KEYS}, **own)


def from_hf_config(raw: Mapping[str, Any], where: str, view: DSAHFConfig, model_class: type, architecture: str,
                   own_keys: tuple[str, ...] = ()) -> tuple[DSAModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) of a DSA config.json dict whose ``view`` the family parsed; its
    ``own_keys`` it reads itself (set on the model after)."""
    archs = list(view.architectures)
    if archs and architecture not in archs:
        raise UserError(f"{where}: architectures {archs} is not {architecture}")
    # the rest reads as DeepSeek-V3 (its refusals, its unknown-field check)
    plain = {k: v for k, v in raw.items() if k not in (*INDEX_KEYS, *LIST_KEYS, *own_keys)}
    plain.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    model, mtp_cfg, vocab = v3.from_hf_config(plain, where, model_class)
    for key in INDEX_KEYS:
        setattr(model, key, getattr(view, key))
    return model, mtp_cfg, vocab
