"""Typed view of a Hugging Face GLM-4.5 family (``glm4_moe``, ``Glm4MoeForCausalLM``) ``config.json``.

``parse_hf_config`` reads the dict once, the way transformers 5 reads it (``Glm4MoeConfig``), so the
model a consumer builds from the view is the model transformers builds from the file:
- rotary settings from ``rope_parameters`` (or ``rope_scaling``), else the top-level ``rope_theta`` /
  ``partial_rotary_factor`` of older files; the ``rope_parameters`` value wins where both are given,
  ``partial_rotary_factor`` defaults to 0.5 and ``rope_theta`` to 10000. Only plain RoPE
  (``rope_type: default``) is represented; GLM-4.5/4.6/4.7 use it;
- ``head_dim`` defaults to ``hidden_size // num_attention_heads``;
- the MTP depth is ``num_nextn_predict_layers`` (or ``num_mtp_layers``), 0 when absent;
- the MoE and attention fields take ``Glm4MoeConfig``'s defaults when absent. The five size fields
  without a default are required: a file lacking one is not a usable GLM config.
Each consumer refuses what it cannot run (decoding: ``inference/model_dir.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import EosIds, eos_ids, missing_or_value, mtp_depth, note_once, read_view_fields
from megatron_mtp.models.hf_common import read_value as _value
from megatron_mtp.models.tensor_table import MoeLayers


@dataclass(frozen=True, kw_only=True)
class Glm4MoeHFConfig:
    """The architecture fields of an HF GLM-4.5-family config.json, as HF names them (fields without a
    default are required)."""

    architectures: tuple[str, ...] = ()
    model_type: str = "glm4_moe"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    """FFN width of the dense layers (the first ``first_k_dense_replace``)."""
    num_hidden_layers: int
    num_nextn_predict_layers: int = 0
    num_attention_heads: int
    num_key_value_heads: int = 8
    """Grouped-query attention: query heads share key/value heads in groups of
    ``num_attention_heads // num_key_value_heads``."""
    head_dim: int = 0
    """0 in the dataclass only while parsing; the view always holds the real width (default
    ``hidden_size // num_attention_heads``)."""
    partial_rotary_factor: float = 0.5
    """RoPE rotates the first ``head_dim * factor`` dimensions of each head (rotate-half style)."""
    rope_theta: float = 10000.0
    use_qk_norm: bool = False
    """An RMSNorm of width ``head_dim`` on every query and key head."""
    attention_bias: bool = False
    """Bias on q/k/v (never on o)."""
    moe_intermediate_size: int = 1408
    n_shared_experts: int = 1
    n_routed_experts: int = 128
    num_experts_per_tok: int = 8
    first_k_dense_replace: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
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

    scoring_func = "sigmoid"
    """GLM-4.5 routes as DeepSeek-V3 does (noaux_tc)."""

    @property
    def rotary_dim(self) -> int:
        """Rotated dimensions per head (transformers: ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)

    @property
    def moe_layers(self) -> MoeLayers:
        """MoE from ``first_k_dense_replace`` on (MTP layers, at index >= num_hidden_layers, too)."""
        return MoeLayers(self.num_hidden_layers, self.n_routed_experts, self.first_k_dense_replace)

    def is_moe_layer(self, layer_index: int) -> bool:
        return layer_index in self.moe_layers


_FIELDS = dataclasses.fields(Glm4MoeHFConfig)
_ROPE_KEYS = ("rope_theta", "partial_rotary_factor")
READ_KEYS = frozenset({f.name for f in _FIELDS} | {"rope_parameters", "rope_scaling", "num_mtp_layers", "dtype"})
"""Every config.json key the view reads."""


def _rope(raw: Mapping[str, Any], where: str) -> dict[str, float]:
    params = raw.get("rope_scaling") or raw.get("rope_parameters") or {}  # transformers reads rope_scaling first
    if not isinstance(params, Mapping):
        raise UserError(f"{where}: the rope settings (rope_parameters) must be a mapping.")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ("default", None):
        raise UserError(f"{where}: rope type '{kind}' is not supported for a GLM-4.5-family model (only the "
                        "default RoPE, which GLM-4.5/4.6/4.7 use).")
    defaults = {"rope_theta": 10000.0, "partial_rotary_factor": 0.5}
    out = {key: _value(params if params.get(key) is not None else raw, key, float, defaults[key], where)
           for key in _ROPE_KEYS}
    for key in _ROPE_KEYS:
        top = _value(raw, key, float, None, where)
        if params.get(key) is not None and top is not None and top != out[key]:
            note_once(f"{where}: rope_parameters gives {key} {params[key]} and the top level {raw[key]}; "
                      f"{params[key]} is used, as transformers does")
    return out


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> Glm4MoeHFConfig:
    """The view of a config.json dict; a missing required field or a malformed one is a UserError."""
    values = read_view_fields(raw, Glm4MoeHFConfig, where, "GLM-4.5-family")
    heads = values["num_attention_heads"]
    if heads < 1 or values["num_key_value_heads"] < 1 or heads % values["num_key_value_heads"]:
        kv = missing_or_value(raw, "num_key_value_heads", values["num_key_value_heads"])
        raise UserError(f"{where}: num_attention_heads ({heads}) must be a positive multiple of num_key_value_heads "
                        f"{kv}.")
    head_dim = values["head_dim"] or values["hidden_size"] // heads
    values.update(
        architectures=tuple(str(a) for a in raw.get("architectures") or ()),
        head_dim=head_dim,
        num_nextn_predict_layers=mtp_depth(raw, where),
        eos_token_id=_value(raw, "eos_token_id", eos_ids, None, where),
        torch_dtype=values["torch_dtype"] or _value(raw, "dtype", str, None, where),
        **_rope(raw, where),
    )
    config = Glm4MoeHFConfig(**values)
    if not 0 < config.rotary_dim <= head_dim or config.rotary_dim % 2:
        raise UserError(f"{where}: partial_rotary_factor {config.partial_rotary_factor} of head_dim {head_dim} gives "
                        f"{config.rotary_dim} rotated dimensions; it must be an even number from 2 to head_dim.")
    return config
