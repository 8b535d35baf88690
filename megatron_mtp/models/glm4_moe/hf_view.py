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
The fields and parsing every grouped-query family shares: models/gqa/hf_view.py.
Each consumer refuses what it cannot run (decoding: ``inference/model_dir.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Mapping

from megatron_mtp.config.moe_layers import MoeLayers
from megatron_mtp.errors import UserError
from megatron_mtp.models.gqa.hf_view import READ_KEYS as _SHARED_KEYS
from megatron_mtp.models.gqa.hf_view import GroupedQueryHFConfig, read_grouped_query, read_rope


@dataclass(frozen=True, kw_only=True)
class Glm4MoeHFConfig(GroupedQueryHFConfig):
    """The architecture fields of an HF GLM-4.5-family config.json, as HF names them (fields without a
    default are required)."""

    model_type: str = "glm4_moe"
    partial_rotary_factor: float = 0.5
    """RoPE rotates the first ``head_dim * factor`` dimensions of each head (rotate-half style)."""
    use_qk_norm: bool = False
    """An RMSNorm of width ``head_dim`` on every query and key head."""
    attention_bias: bool = False
    """Bias on q/k/v (never on o)."""
    n_shared_experts: int = 1
    n_routed_experts: int = 128
    first_k_dense_replace: int = 1
    n_group: int = 1
    topk_group: int = 1
    routed_scaling_factor: float = 1.0

    scoring_func = "sigmoid"
    """GLM-4.5 routes as DeepSeek-V3 does (noaux_tc)."""

    @property
    def rotary_dim(self) -> int:
        """Rotated dimensions per head (transformers: ``int(head_dim * partial_rotary_factor)``)."""
        return int(self.head_dim * self.partial_rotary_factor)

    @property
    def moe_layers(self) -> MoeLayers:
        """MoE from ``first_k_dense_replace`` on (MTP layers, at index >= num_hidden_layers, too)."""
        return MoeLayers(self.num_hidden_layers, self.n_routed_experts, self.first_k_dense_replace)

    def is_moe_layer(self, layer_index: int) -> bool:
        return layer_index in self.moe_layers


READ_KEYS = frozenset({f.name for f in dataclasses.fields(Glm4MoeHFConfig)} | _SHARED_KEYS)
"""Every config.json key the view reads."""


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> Glm4MoeHFConfig:
    """The view of a config.json dict; a missing required field or a malformed one is a UserError."""
    values = read_grouped_query(raw, Glm4MoeHFConfig, where, "GLM-4.5-family")
    values.update(read_rope(raw, where, {"rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                            "for a GLM-4.5-family model (only the default RoPE, which GLM-4.5/4.6/4.7 use)."))
    config = Glm4MoeHFConfig(**values)
    head_dim = config.head_dim
    if not 0 < config.rotary_dim <= head_dim or config.rotary_dim % 2:
        raise UserError(f"{where}: partial_rotary_factor {config.partial_rotary_factor} of head_dim {head_dim} gives "
                        f"{config.rotary_dim} rotated dimensions; it must be an even number from 2 to head_dim.")
    return config
