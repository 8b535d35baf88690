"""Typed view of a Hugging Face DSA model's ``config.json`` (DeepSeek-V3.2, GLM-5): DeepSeek-V3's view
(models/mla/hf_view.py, which the importer reads) with the lightning indexer's three fields, and
transformers' per-layer lists (``mlp_layer_types``, ``layer_types``) checked against what the scalar fields
say. A family's view subclasses ``DSAHFConfig`` (its ``model_type``, its defaults, fields of its own)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, TypeVar

from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import read_value
from megatron_mtp.models.mla.hf_view import READ_KEYS as V3_READ_KEYS
from megatron_mtp.models.mla.hf_view import DeepseekV3HFConfig
from megatron_mtp.models.mla.hf_view import parse_hf_config as parse_v3


@dataclass(frozen=True, kw_only=True)
class DSAHFConfig(DeepseekV3HFConfig):
    """DeepSeek-V3's fields and the lightning indexer's (DeepSeek-V3.2's defaults in transformers)."""

    index_n_heads: int = 64
    index_head_dim: int = 128
    index_topk: int = 2048


INDEX_KEYS = ("index_n_heads", "index_head_dim", "index_topk")
LIST_KEYS = ("mlp_layer_types", "layer_types", "mlp_bias")
"""What transformers writes beside the scalar fields, checked and never written back (transformers derives it)."""
READ_KEYS = V3_READ_KEYS | set(INDEX_KEYS) | set(LIST_KEYS)
"""Every config.json key the view reads."""

View = TypeVar("View", bound=DSAHFConfig)


def parse_dsa_config(raw: Mapping[str, Any], where: str, view: type[View], **own: Any) -> View:
    """The ``view`` of a DSA config.json dict with the family's ``own`` fields; a malformed or contradicting
    field is a UserError."""
    v3 = parse_v3(raw, where)
    index = {k: read_value(raw, k, int, view.__dataclass_fields__[k].default, where) for k in INDEX_KEYS}
    for key, value in index.items():
        if value < 1:
            raise UserError(f"{where}: field '{key}' is {value}; it must be a positive integer; "
                            "correct it in that file.")
    fields = {f.name: getattr(v3, f.name) for f in dataclasses.fields(v3)}
    fields["model_type"] = raw.get("model_type") or view.__dataclass_fields__["model_type"].default
    out = view(**fields, **index, **own)
    layers = out.num_hidden_layers
    mlp_types = raw.get("mlp_layer_types")
    if mlp_types is not None:
        expected = ["sparse" if out.is_moe_layer(i) else "dense" for i in range(layers)]
        if list(mlp_types) != expected:
            raise UserError(f"{where}: mlp_layer_types {list(mlp_types)} is not what first_k_dense_replace "
                            f"({out.first_k_dense_replace}) gives, {expected}; only that pattern can be represented")
    layer_types = raw.get("layer_types")
    if layer_types is not None and list(layer_types) != ["indexed_attention"] * layers:
        raise UserError(f"{where}: layer_types {list(layer_types)} is not 'indexed_attention' for every layer; "
                        "only DSA in every layer can be represented")
    if raw.get("mlp_bias"):
        raise UserError(f"{where}: mlp_bias is true; the MLPs have no bias, so it cannot be represented")
    return out
