"""Typed view of a Hugging Face DeepSeek-V3/V2 ``config.json``, read by convert and decoding alike.

``parse_hf_config`` reads the dict once: the official release's ``rope_scaling`` + ``rope_theta`` and
transformers 5's ``rope_parameters`` give the same view, as do ``num_nextn_predict_layers`` and
``num_mtp_layers`` (``mtp_depth``). ``to_dict`` writes the release spelling. A missing (or null)
field takes the default below; each consumer refuses what it cannot run (convert:
``hf_config.from_hf_config``; decoding: ``inference/model_dir.py``).

YaRN ``mscale``/``mscale_all_dim`` default to 1.0/0.0, megatron-core's defaults: with them
megatron-core computes the attention factor and softmax scale that transformers computes for a file
giving neither. (For a file giving ``mscale_all_dim`` without ``mscale`` the two libraries disagree
whatever the default; the view, and so the decoder, takes megatron-core's reading, mscale 1.0.)
A missing ``original_max_position_embeddings`` is ``max_position_embeddings`` and a missing
``factor`` their ratio, as in transformers.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import EosIds, YarnScaling, eos_ids, mtp_depth, read_view_fields
from megatron_mtp.models.hf_common import read_value as _value
from megatron_mtp.models.tensor_table import MoeLayers


@dataclass(frozen=True, kw_only=True)
class DeepseekV3HFConfig:
    """The architecture fields of an HF DeepSeek-V3/V2 config.json, as HF names them, in the
    official release's order (fields without a default are required)."""

    architectures: tuple[str, ...] = ()
    model_type: str = "deepseek_v3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    moe_intermediate_size: Optional[int] = None
    num_hidden_layers: int
    num_nextn_predict_layers: int = 0
    num_attention_heads: int
    num_key_value_heads: Optional[int] = None
    q_lora_rank: Optional[int] = None
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    n_shared_experts: int = 0
    n_routed_experts: int = 0
    """0: a dense model (then ``num_experts_per_tok`` is written as null; the two counts stay integers,
    as transformers' config class requires)."""
    num_experts_per_tok: int = 1
    first_k_dense_replace: int = 0
    moe_layer_freq: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    scoring_func: str = "sigmoid"
    """Default "softmax" for model_type deepseek_v2."""
    topk_method: str = "noaux_tc"
    """Default "greedy" for softmax scoring."""
    norm_topk_prob: bool = True
    """Default false for model_type deepseek_v2 (as in transformers)."""
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[YarnScaling] = None
    """None: plain RoPE."""
    rope_interleave: bool = True
    max_position_embeddings: int = 4096
    attention_bias: bool = False
    attention_dropout: float = 0.0
    initializer_range: float = 0.02
    tie_word_embeddings: bool = False
    bos_token_id: Optional[int] = None
    eos_token_id: EosIds = None
    torch_dtype: Optional[str] = None
    # written only when set
    pretraining_tp: Optional[int] = None
    aux_loss_alpha: Optional[float] = None
    quantization_config: Optional[dict] = None

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)

    @property
    def moe_layers(self) -> MoeLayers:
        """MoE from ``first_k_dense_replace`` on, every ``moe_layer_freq`` layers (MTP layers too)."""
        return MoeLayers(self.num_hidden_layers, self.n_routed_experts, self.first_k_dense_replace,
                         self.moe_layer_freq)

    def is_moe_layer(self, layer_index: int) -> bool:
        return layer_index in self.moe_layers

    def to_dict(self) -> dict[str, Any]:
        """The config.json dict, keys in the release's order."""
        out: dict[str, Any] = {}
        moe = self.n_routed_experts > 0
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.name in ("pretraining_tp", "aux_loss_alpha", "quantization_config") and value is None:
                continue
            if f.name in ("n_shared_experts", "n_routed_experts") and not moe:
                value = 0
            elif f.name == "num_experts_per_tok" and not moe:
                value = None
            elif f.name == "rope_scaling" and value is not None:
                value = value.to_dict()
            elif isinstance(value, tuple):
                value = list(value)
            out[f.name] = value
            if f.name == "torch_dtype":
                out["use_cache"] = True
        return out


_FIELDS = dataclasses.fields(DeepseekV3HFConfig)
READ_KEYS = frozenset({f.name for f in _FIELDS} | {"rope_parameters", "num_mtp_layers", "dtype"})
"""Every config.json key the view reads."""


def _rope(raw: Mapping[str, Any], max_positions: int, where: str) -> tuple[float, Optional[YarnScaling]]:
    params = raw.get("rope_parameters") or {}
    source = raw.get("rope_scaling") or params  # transformers reads rope_scaling first
    if not isinstance(source, Mapping) or not isinstance(params, Mapping):
        raise UserError(f"{where}: the rope settings must be a mapping")
    holder = next((h for h in (source, raw, params) if h.get("rope_theta") is not None), {})
    theta = _value(holder, "rope_theta", float, 10000.0, where)
    kind = source.get("rope_type", source.get("type", "default"))
    if kind in ("default", None):
        return theta, None
    if kind != "yarn":
        raise UserError(f"{where}: rope scaling type '{kind}' cannot be represented (only yarn or none)")
    original = _value(source, "original_max_position_embeddings", int, max_positions, where)
    if original < 1:
        raise UserError(f"{where}: original_max_position_embeddings must be positive, not {original}")
    return theta, YarnScaling(
        factor=_value(source, "factor", float, max_positions / original, where),
        original_max_position_embeddings=original,
        beta_fast=_value(source, "beta_fast", float, 0.0, where) or 32.0,
        beta_slow=_value(source, "beta_slow", float, 0.0, where) or 1.0,
        mscale=_value(source, "mscale", float, 1.0, where),
        mscale_all_dim=_value(source, "mscale_all_dim", float, 0.0, where),
        attention_factor=_value(source, "attention_factor", float, None, where),
        truncate=_value(source, "truncate", bool, True, where),
    )


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> DeepseekV3HFConfig:
    """The view of a config.json dict; a missing required field or a malformed one is a UserError."""
    values = read_view_fields(raw, DeepseekV3HFConfig, where, "DeepSeek-V3/V2")
    model_type, experts = values["model_type"], values["n_routed_experts"]
    if experts and values["moe_intermediate_size"] is None:
        raise UserError(f"{where} has no 'moe_intermediate_size'; it is required for a DeepSeek-V3/V2 model")
    scoring = _value(raw, "scoring_func", str, "softmax" if model_type == "deepseek_v2" else "sigmoid", where)
    theta, yarn = _rope(raw, values["max_position_embeddings"], where)
    values.update(
        architectures=tuple(str(a) for a in raw.get("architectures") or ()),
        num_nextn_predict_layers=mtp_depth(raw, where),
        n_shared_experts=values["n_shared_experts"] if experts else 0,
        num_experts_per_tok=values["num_experts_per_tok"] if experts else 1,
        scoring_func=scoring,
        topk_method=_value(raw, "topk_method", str, "noaux_tc" if scoring == "sigmoid" else "greedy", where),
        norm_topk_prob=_value(raw, "norm_topk_prob", bool, model_type != "deepseek_v2", where),
        rope_theta=theta,
        rope_scaling=yarn,
        eos_token_id=_value(raw, "eos_token_id", eos_ids, None, where),
        torch_dtype=values["torch_dtype"] or _value(raw, "dtype", str, None, where),
    )
    return DeepseekV3HFConfig(**values)
