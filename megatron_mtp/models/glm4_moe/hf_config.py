"""Our model config <-> Hugging Face GLM-4.5 config.json (``Glm4MoeForCausalLM``), both ways, never lossy.

``to_hf_config`` writes the release's spelling (``rope_theta`` and ``partial_rotary_factor`` at the
top level, ``head_dim``, ``use_qk_norm``, ``attention_bias``, MTP depth as ``num_nextn_predict_layers``);
``from_hf_config`` also reads transformers 5's ``rope_parameters`` and ``num_mtp_layers``. A field whose
value our model cannot reproduce is a ``UserError`` naming it (../shared notes: glm4-moe-hf-format).

GLM's router is always sigmoid with ``e_score_correction_bias`` and scores an expert group by the
sum of its top-2 experts, as DeepSeek-V3's (models/hf_common.py ``check_group_routing``); every layer
from ``first_k_dense_replace`` on is MoE.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.glm4_moe.hf_view import READ_KEYS, parse_hf_config
from megatron_mtp.models.glm4_moe.model_config import Glm4MoeModelConfig as ModelConfig
from megatron_mtp.models.gqa.hf_config import hf_values, model_values
from megatron_mtp.models.gqa.model_config import rotary_percent
from megatron_mtp.models.hf_common import (
    IGNORED_ANY_FAMILY,
    NOT_CARRIED_ANY_FAMILY,
    HFConfigFile,
    check_group_routing,
    check_keys,
    check_mtp_export,
)
from megatron_mtp.models.hf_common import carry_source_fields as _carry

NOT_CARRIED = {
    **NOT_CARRIED_ANY_FAMILY,
    "rope_parameters": "transformers' spelling of rope_theta + partial_rotary_factor, which are written instead",
    "architectures": "exports are Glm4MoeForCausalLM",
    "model_type": "exports are glm4_moe",
}
_IGNORED = IGNORED_ANY_FAMILY
_READ = READ_KEYS
"""What the converter reads: the typed view's keys (hf_view.READ_KEYS)."""


def to_hf_config(model: ModelConfig, mtp: MTPConfig, *, vocab_size: int, num_nextn_predict_layers: int,
                 torch_dtype: str = "bfloat16", bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None) -> HFConfigFile:
    """The HF config of a model with this architecture (vocab from the weights)."""
    check_mtp_export(model, mtp, num_nextn_predict_layers, "GLM-4.5")
    moe = model.num_experts > 0
    if moe and (model.router_score_function != "sigmoid" or not model.router_enable_expert_bias):
        raise UserError(
            "the Hugging Face GLM-4.5 format routes with sigmoid scores and e_score_correction_bias; train with "
            "model.router_score_function=sigmoid and model.router_enable_expert_bias=true")
    groups = model.router_num_groups or 1
    values = hf_values(
        model, architecture="Glm4MoeForCausalLM", model_type="glm4_moe", vocab_size=vocab_size,
        num_nextn_predict_layers=num_nextn_predict_layers, torch_dtype=torch_dtype, bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        partial_rotary_factor=rotary_percent(model),
        attention_bias=model.add_qkv_bias,
        attention_dropout=0.0,
        use_qk_norm=model.qk_layernorm,
        n_shared_experts=model.num_shared_experts if moe else 0,
        n_routed_experts=model.num_experts if moe else 0,
        num_experts_per_tok=model.router_topk if moe else 1,
        first_k_dense_replace=model.first_k_dense if moe else model.num_layers,
        n_group=groups,
        topk_group=(model.router_group_topk or 1) if groups > 1 else 1,
        routed_scaling_factor=model.router_topk_scaling_factor,
        norm_topk_prob=model.router_norm_topk_prob,
        hidden_act="silu",
    )
    return HFConfigFile(values)


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF GLM-4.5 config.json dict, read through the
    typed view the decoder reads too (hf_view.parse_hf_config: transformers' defaults and rope
    precedence), plus what only the converter refuses (other architectures, unknown fields)."""
    check_keys(raw, where, "Glm4MoeForCausalLM", _READ | _IGNORED)
    view = parse_hf_config(raw, where)
    if view.hidden_act != "silu":
        raise UserError(f"{where}: 'hidden_act' = {view.hidden_act!r} cannot be represented (only SwiGLU MLPs)")
    if view.attention_dropout != 0.0:
        raise UserError(f"{where}: 'attention_dropout' = {view.attention_dropout!r} cannot be represented")
    experts, groups, num_layers = view.n_routed_experts, view.n_group, view.num_hidden_layers
    model = ModelConfig(
        family="glm4_moe",
        **model_values(view),
        rotary_percent=view.partial_rotary_factor,
        qk_layernorm=view.use_qk_norm,
        add_qkv_bias=view.attention_bias,
        num_experts=experts,
        first_k_dense=min(view.first_k_dense_replace, num_layers) if experts else 0,
        num_shared_experts=view.n_shared_experts if experts else 0,
        router_topk=view.num_experts_per_tok if experts else 1,
        router_num_groups=groups if groups > 1 else None,
        router_group_topk=view.topk_group if groups > 1 else None,
        router_score_function="sigmoid",
        router_topk_scaling_factor=view.routed_scaling_factor,
        router_norm_topk_prob=view.norm_topk_prob,
        router_enable_expert_bias=True,
    )
    if experts:
        check_group_routing(model, where)
    return model, MTPConfig(num_layers=view.num_nextn_predict_layers), view.vocab_size


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as GLM-4.5."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
