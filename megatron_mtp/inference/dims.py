"""Typed view of a Hugging Face DeepSeek-V3 ``config.json`` (the fields decoding needs).

Accepts both spellings of the rotary settings: the official release's ``rope_scaling`` +
``rope_theta`` and transformers 5's ``rope_parameters`` (which folds ``rope_theta`` in).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from megatron_mtp.errors import UserError


@dataclass(frozen=True)
class RopeSettings:
    """Rotary embedding settings: plain RoPE or DeepSeek YaRN."""

    theta: float
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position_embeddings: int | None = None
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float | None = None
    mscale_all_dim: float | None = None
    attention_factor: float | None = None
    truncate: bool = True


@dataclass(frozen=True)
class DeepseekV3Dims:
    """Shapes and hyper-parameters of a DeepSeek-V3 model, read from config.json."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    q_lora_rank: int | None
    moe_intermediate_size: int
    n_routed_experts: int | None
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    first_k_dense_replace: int
    moe_layer_freq: int
    routed_scaling_factor: float
    norm_topk_prob: bool
    rms_norm_eps: float
    rope: RopeSettings
    rope_interleave: bool
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    num_nextn_predict_layers: int
    eos_token_ids: tuple[int, ...] = field(default_factory=tuple)

    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    def is_moe_layer(self, layer_index: int) -> bool:
        """HF rule: MoE from ``first_k_dense_replace`` on, every ``moe_layer_freq`` layers."""
        return (
            self.n_routed_experts is not None
            and layer_index >= self.first_k_dense_replace
            and layer_index % self.moe_layer_freq == 0
        )


def _rope_settings(raw: dict[str, Any], where: Path) -> RopeSettings:
    params = raw.get("rope_parameters") or raw.get("rope_scaling") or {}
    if not isinstance(params, dict):
        raise UserError(f"{where}: rope settings must be a mapping; re-export the model.")
    theta = float(params.get("rope_theta", raw.get("rope_theta", 10000.0)))
    rope_type = str(params.get("rope_type", params.get("type", "default")))
    if rope_type not in ("default", "yarn"):
        raise UserError(
            f"{where}: rope type {rope_type!r} is not supported by megatron-mtp generate "
            "(only default and yarn); export the model with one of those."
        )
    if rope_type == "default":
        return RopeSettings(theta=theta)
    factor = params.get("factor")
    original = params.get("original_max_position_embeddings")
    if original is None:
        raise UserError(f"{where}: yarn rope needs original_max_position_embeddings; add it.")
    if factor is None:
        factor = raw["max_position_embeddings"] / original
    return RopeSettings(
        theta=theta,
        rope_type="yarn",
        factor=float(factor),
        original_max_position_embeddings=int(original),
        beta_fast=float(params.get("beta_fast") or 32),
        beta_slow=float(params.get("beta_slow") or 1),
        mscale=params.get("mscale"),
        mscale_all_dim=params.get("mscale_all_dim"),
        attention_factor=params.get("attention_factor"),
        truncate=bool(params.get("truncate", True)),
    )


def read_config_json(path: Path) -> dict[str, Any]:
    """Read a config.json, turning a missing or broken file into a UserError."""
    if not path.is_file():
        raise UserError(f"{path} does not exist; point at a Hugging Face DeepSeek-V3 export.")
    try:
        raw = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{path} is not valid JSON ({exc}); re-export the model.") from exc
    if not isinstance(raw, dict):
        raise UserError(f"{path} must hold a JSON object; re-export the model.")
    return raw


def dims_from_config(raw: dict[str, Any], where: Path) -> DeepseekV3Dims:
    """Build :class:`DeepseekV3Dims` from a parsed config.json; bad fields raise UserError."""
    if raw.get("model_type") not in ("deepseek_v3", None):
        raise UserError(
            f"{where}: model_type is {raw.get('model_type')!r}, expected 'deepseek_v3'; "
            "megatron-mtp generate only decodes DeepSeek-V3 exports."
        )
    if raw.get("quantization_config"):
        raise UserError(
            f"{where}: quantized (FP8) weights are not supported; dequantize to bf16/fp32 first."
        )
    if raw.get("scoring_func", "sigmoid") != "sigmoid":
        raise UserError(f"{where}: only scoring_func 'sigmoid' (DeepSeek-V3 routing) is supported.")
    if raw.get("hidden_act", "silu") != "silu":
        raise UserError(f"{where}: only hidden_act 'silu' is supported.")
    eos = raw.get("eos_token_id")
    eos_ids: tuple[int, ...] = tuple(eos) if isinstance(eos, list) else (() if eos is None else (int(eos),))
    try:
        dims = DeepseekV3Dims(
            vocab_size=int(raw["vocab_size"]),
            hidden_size=int(raw["hidden_size"]),
            intermediate_size=int(raw["intermediate_size"]),
            num_hidden_layers=int(raw["num_hidden_layers"]),
            num_attention_heads=int(raw["num_attention_heads"]),
            kv_lora_rank=int(raw["kv_lora_rank"]),
            qk_nope_head_dim=int(raw["qk_nope_head_dim"]),
            qk_rope_head_dim=int(raw["qk_rope_head_dim"]),
            v_head_dim=int(raw["v_head_dim"]),
            q_lora_rank=None if raw.get("q_lora_rank") is None else int(raw["q_lora_rank"]),
            moe_intermediate_size=int(raw.get("moe_intermediate_size", 0)),
            n_routed_experts=None if raw.get("n_routed_experts") is None else int(raw["n_routed_experts"]),
            n_shared_experts=int(raw.get("n_shared_experts") or 0),
            num_experts_per_tok=int(raw.get("num_experts_per_tok") or 1),
            n_group=int(raw.get("n_group") or 1),
            topk_group=int(raw.get("topk_group") or 1),
            first_k_dense_replace=int(raw.get("first_k_dense_replace", 0)),
            moe_layer_freq=int(raw.get("moe_layer_freq", 1)),
            routed_scaling_factor=float(raw.get("routed_scaling_factor", 1.0)),
            norm_topk_prob=bool(raw.get("norm_topk_prob", True)),
            rms_norm_eps=float(raw.get("rms_norm_eps", 1e-6)),
            rope=_rope_settings(raw, where),
            rope_interleave=bool(raw.get("rope_interleave", True)),
            max_position_embeddings=int(raw.get("max_position_embeddings", 4096)),
            tie_word_embeddings=bool(raw.get("tie_word_embeddings", False)),
            attention_bias=bool(raw.get("attention_bias", False)),
            num_nextn_predict_layers=int(raw.get("num_nextn_predict_layers") or 0),
            eos_token_ids=eos_ids,
        )
    except KeyError as exc:
        raise UserError(f"{where}: config.json lacks the field {exc.args[0]!r}; re-export the model.") from exc
    except (TypeError, ValueError) as exc:
        raise UserError(f"{where}: config.json has a malformed field ({exc}); re-export the model.") from exc
    return dims
