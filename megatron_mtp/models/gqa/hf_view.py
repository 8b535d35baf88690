"""The config.json fields every grouped-query family's typed view shares, and how they are read.

A family's view (models/<family>/hf_view.py) derives from ``GroupedQueryHFConfig``, redeclares
the fields whose transformers default differs (each family's ``*Config`` class has its own), adds its
own, and parses through ``read_grouped_query`` (the shared fields and checks) and ``read_rope`` (the
rotary settings: ``rope_scaling`` or ``rope_parameters`` over the top-level keys of older files, as
transformers 5 reads them; the ``rope_parameters`` value wins where both are given, with a note).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import EosIds, eos_ids, missing_or_value, mtp_depth, note_once, read_view_fields
from megatron_mtp.models.hf_common import read_value as _value


@dataclass(frozen=True, kw_only=True)
class GroupedQueryHFConfig:
    """The architecture fields of a grouped-query family's config.json, as HF names them (fields without
    a default are required)."""

    architectures: tuple[str, ...] = ()
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """FFN width of the dense layers."""
    num_hidden_layers: int
    num_nextn_predict_layers: int = 0
    num_attention_heads: int
    num_key_value_heads: int = 8
    """Grouped-query attention: query heads share key/value heads in groups of
    ``num_attention_heads // num_key_value_heads``."""
    head_dim: int = 0
    """0 in the dataclass only while parsing; the view always holds the real width (default
    ``hidden_size // num_attention_heads``)."""
    rope_theta: float = 10000.0
    attention_bias: bool = False
    moe_intermediate_size: int = 1408
    num_experts_per_tok: int = 8
    norm_topk_prob: bool = True
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 131072
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_id: EosIds = None
    pad_token_id: Optional[int] = None
    torch_dtype: Optional[str] = None
    quantization_config: Optional[dict] = None

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)


READ_KEYS = frozenset({"rope_parameters", "rope_scaling", "num_mtp_layers", "dtype"})
"""config.json keys every grouped-query view reads besides its fields."""


def read_grouped_query(raw: Mapping[str, Any], view: type, where: str, title: str) -> dict[str, Any]:
    """The values of ``view``'s fields from ``raw`` (``title`` names the model in errors), with the shared
    ones resolved: the head width, the MTP depth, the EOS ids and the dtype; the key/value heads checked."""
    values = read_view_fields(raw, view, where, title)
    heads = values["num_attention_heads"]
    if heads < 1 or values["num_key_value_heads"] < 1 or heads % values["num_key_value_heads"]:
        kv = missing_or_value(raw, "num_key_value_heads", values["num_key_value_heads"])
        raise UserError(f"{where}: num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads "
                        f"{kv}.")
    values.update(
        architectures=tuple(str(a) for a in raw.get("architectures") or ()),
        head_dim=values["head_dim"] or values["hidden_size"] // heads,
        num_nextn_predict_layers=mtp_depth(raw, where),
        eos_token_id=_value(raw, "eos_token_id", eos_ids, None, where),
        torch_dtype=values["torch_dtype"] or _value(raw, "dtype", str, None, where),
    )
    return values


def read_rope(raw: Mapping[str, Any], where: str, defaults: Mapping[str, float], refusal: str) -> dict[str, float]:
    """The rotary settings ``defaults`` names (e.g. rope_theta, partial_rotary_factor), read as transformers
    reads them; a rope type other than the default is a UserError ending in ``refusal``."""
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}  # transformers reads rope_scaling first
    if not isinstance(params, Mapping):
        raise UserError(f"{where}: the rope settings (rope_parameters) must be a mapping.")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise UserError(f"{where}: rope type '{kind}' is not supported {refusal}")
    out = {key: _value(params if params.get(key) is not None else raw, key, float, default, where)
           for key, default in defaults.items()}
    for key in defaults:
        top = _value(raw, key, float, None, where)
        if params.get(key) is not None and top is not None and top != out[key]:
            note_once(f"{where}: rope_parameters gives {key} {params[key]} and the top level {raw[key]}; "
                      f"{params[key]} is used, as transformers does")
    return out
