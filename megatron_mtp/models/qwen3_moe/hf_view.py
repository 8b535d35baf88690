"""Typed view of a Hugging Face Qwen3-MoE ``config.json`` (``qwen3_moe``, ``Qwen3MoeForCausalLM``).

``parse_hf_config`` reads the dict once, the way transformers 5 reads it (``Qwen3MoeConfig``), so the
model a consumer builds from the view is the model transformers builds from the file:
- ``rope_theta`` from ``rope_parameters`` (or ``rope_scaling``) over the top-level key of older files,
  default 10000; only plain RoPE (``rope_type: default``) is represented, over every head dimension;
- ``head_dim`` defaults to ``hidden_size // num_attention_heads`` (the releases set 128);
- the routed experts are ``num_experts`` (transformers 5 also writes ``num_local_experts``);
- layer i is MoE when ``i not in mlp_only_layers`` and ``(i + 1) % decoder_sparse_step == 0``;
- the MTP depth is ``num_nextn_predict_layers`` (ours: the releases ship no MTP), 0 when absent.
The names the decoder's shared layers read (``models.hf_common.HFView``) are properties over
Qwen3's own: no shared experts, no expert groups, no routed scaling, softmax scores.
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
from megatron_mtp.models.hf_common import read_value as _value


@dataclass(frozen=True, kw_only=True)
class Qwen3MoeHFConfig(GroupedQueryHFConfig):
    """The architecture fields of an HF Qwen3-MoE config.json, as HF names them (fields without a
    default are required)."""

    model_type: str = "qwen3_moe"
    num_key_value_heads: int = 4
    attention_bias: bool = False
    """Bias on q/k/v and o (Qwen3-MoE: none)."""
    use_sliding_window: bool = False
    moe_intermediate_size: int = 768
    num_experts: int = 128
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    norm_topk_prob: bool = False
    router_aux_loss_coef: float = 0.001
    rms_norm_eps: float = 1e-6
    max_position_embeddings: int = 32768

    # -- the names every family's view shares (models/hf_common.HFView)
    @property
    def n_routed_experts(self) -> int:
        return self.num_experts

    n_shared_experts = 0
    n_group = 1
    topk_group = 1
    routed_scaling_factor = 1.0
    scoring_func = "softmax"
    """Softmax over every expert, then the top k (renormalised when norm_topk_prob)."""
    use_qk_norm = True
    """Qwen3 always normalises each query and key head."""
    partial_rotary_factor = 1.0

    @property
    def rotary_dim(self) -> int:
        """Qwen3 rotates every dimension of each head."""
        return self.head_dim

    @property
    def moe_layers(self) -> MoeLayers:
        step = self.decoder_sparse_step
        return MoeLayers(self.num_hidden_layers, self.num_experts, every=step, phase=step - 1,
                         dense=frozenset(self.mlp_only_layers), mtp_index=0)

    def is_moe_layer(self, layer_index: int) -> bool:
        """Decoder layer ``layer_index`` has a routed MLP; an MTP layer (index >= num_hidden_layers) is built
        as SGLang's draft builds it, as layer 0, and so does training (config/moe_layers.py)."""
        rule = self.moe_layers
        return (rule.mtp if layer_index >= self.num_hidden_layers else layer_index in rule)


READ_KEYS = frozenset({f.name for f in dataclasses.fields(Qwen3MoeHFConfig)} | _SHARED_KEYS | {"num_local_experts"})
"""Every config.json key the view reads."""


def _rope_theta(raw: Mapping[str, Any], where: str) -> float:
    rope = read_rope(raw, where, {"rope_theta": 10000.0, "partial_rotary_factor": 1.0},
                     "for a Qwen3-MoE model (only the default RoPE, which the Qwen3-MoE releases use; their YaRN is a "
                     "serving-time option).")
    if rope["partial_rotary_factor"] != 1.0:
        raise UserError(f"{where}: partial_rotary_factor {rope['partial_rotary_factor']} cannot be represented; "
                        "Qwen3-MoE rotates every dimension of each head.")
    return rope["rope_theta"]


def _layer_list(raw: Mapping[str, Any], where: str) -> tuple[int, ...]:
    value = raw.get("mlp_only_layers") or []
    if not isinstance(value, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool) for i in value):
        raise UserError(f"{where}: field 'mlp_only_layers' has a malformed value {value!r}; it must be a list of "
                        "layer indices; correct it in that file.")
    return tuple(value)


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> Qwen3MoeHFConfig:
    """The view of a config.json dict; a missing required field or a malformed one is a UserError."""
    values = read_grouped_query(raw, Qwen3MoeHFConfig, where, "Qwen3-MoE")
    experts = _value(raw, "num_experts", int, None, where)
    if experts is None:
        experts = _value(raw, "num_local_experts", int, 128, where)
    if values["decoder_sparse_step"] < 1:
        raise UserError(f"{where}: decoder_sparse_step is {values['decoder_sparse_step']}; it must be a positive "
                        "integer; correct it in that file.")
    values.update(num_experts=experts, mlp_only_layers=_layer_list(raw, where), rope_theta=_rope_theta(raw, where))
    return Qwen3MoeHFConfig(**values)
