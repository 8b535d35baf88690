"""Our model config <-> Hugging Face Qwen3-MoE config.json (``Qwen3MoeForCausalLM``), both ways, never lossy.

``to_hf_config`` writes the release's spelling (Qwen/Qwen3-30B-A3B's config.json: ``num_experts``,
``decoder_sparse_step``, ``mlp_only_layers``, ``norm_topk_prob``, ``head_dim``, top-level ``rope_theta``)
plus ``num_nextn_predict_layers`` for the MTP modules an export holds (the releases have none).
``from_hf_config`` reads the file through the typed view the decoder reads too
(hf_view.parse_hf_config). A field whose value our model cannot reproduce is a ``UserError``
naming it.

Routing: softmax over every expert, top k, renormalised over the k when ``norm_topk_prob`` (megatron-core:
softmax after the top k, the same weights; pre-softmax when not renormalised), no expert bias, groups,
shared experts or scaling. ``model.first_k_dense`` has no Qwen spelling: its layers join ``mlp_only_layers``.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.gqa.hf_config import hf_values, model_values
from megatron_mtp.models.hf_common import (
    IGNORED_ANY_FAMILY,
    NOT_CARRIED_ANY_FAMILY,
    HFConfigFile,
    check_keys,
    check_mtp_export,
)
from megatron_mtp.models.hf_common import carry_source_fields as _carry
from megatron_mtp.models.qwen3_moe.hf_view import READ_KEYS, parse_hf_config
from megatron_mtp.models.qwen3_moe.model_config import Qwen3MoeModelConfig as ModelConfig

NOT_CARRIED = {
    **NOT_CARRIED_ANY_FAMILY,
    "rope_parameters": "transformers' spelling of rope_theta, which is written instead",
    "num_local_experts": "transformers' spelling of num_experts",
    "architectures": "exports are Qwen3MoeForCausalLM",
    "model_type": "exports are qwen3_moe",
}
_IGNORED = IGNORED_ANY_FAMILY | {"sliding_window", "max_window_layers"}
"""Fields that do not change the model's function (``sliding_window`` and ``max_window_layers`` only act
with ``use_sliding_window``, which is refused)."""
_REFUSED = {
    "attention_bias": (False, "Qwen3-MoE has no attention bias"),
    "use_sliding_window": (False, "only full causal attention is represented"),
    "hidden_act": ("silu", "only SwiGLU MLPs are represented"),
    "attention_dropout": (0.0, "attention dropout is not represented"),
}


def _check_routing(model: ModelConfig, where: str) -> None:
    """What the Qwen3-MoE format cannot say about the router: one sentence for the first."""
    wanted = {"router_score_function": "softmax", "router_enable_expert_bias": False, "router_num_groups": None,
              "num_shared_experts": 0, "router_topk_scaling_factor": 1.0}
    for key, value in wanted.items():
        if getattr(model, key) != value:
            raise UserError(f"{where}: model.{key}={getattr(model, key)} cannot be written in the Qwen3-MoE format, "
                            f"whose router is softmax top-k without expert bias, groups, shared experts or scaling; "
                            f"train with model.{key}={'null' if value is None else value}")


def to_hf_config(model: ModelConfig, mtp: MTPConfig, *, vocab_size: int, num_nextn_predict_layers: int,
                 torch_dtype: str = "bfloat16", bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None) -> HFConfigFile:
    """The HF config of a model with this architecture (vocab from the weights)."""
    check_mtp_export(model, mtp, num_nextn_predict_layers, "Qwen3-MoE")
    moe = model.num_experts > 0
    if moe:
        _check_routing(model, "model config")
    dense_first = list(range(model.first_k_dense)) if moe else []
    values = hf_values(
        model, architecture="Qwen3MoeForCausalLM", model_type="qwen3_moe", vocab_size=vocab_size,
        num_nextn_predict_layers=num_nextn_predict_layers, torch_dtype=torch_dtype, bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        attention_bias=False,
        attention_dropout=0.0,
        num_experts=model.num_experts,
        num_experts_per_tok=model.router_topk if moe else 1,
        decoder_sparse_step=model.decoder_sparse_step,
        mlp_only_layers=sorted(set(dense_first) | set(model.mlp_only_layers)),
        norm_topk_prob=model.router_norm_topk_prob,
        router_aux_loss_coef=model.aux_loss_coeff,
        output_router_logits=False,
        hidden_act="silu",
        use_sliding_window=False,
        sliding_window=None,
    )
    return HFConfigFile(values)


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF Qwen3-MoE config.json dict, read through the typed
    view (hf_view.parse_hf_config), plus what only the converter refuses (other architectures,
    unknown fields, what our model cannot compute)."""
    check_keys(raw, where, "Qwen3MoeForCausalLM", READ_KEYS | _IGNORED)
    view = parse_hf_config(raw, where)
    for key, (allowed, why) in _REFUSED.items():
        if getattr(view, key) != allowed:
            raise UserError(f"{where}: '{key}' = {getattr(view, key)!r} cannot be represented ({why})")
    num_layers = view.num_hidden_layers
    outside = [i for i in view.mlp_only_layers if not 0 <= i < num_layers]
    if outside:
        raise UserError(f"{where}: mlp_only_layers names layer {outside[0]}, outside the {num_layers} layers")
    experts = view.num_experts
    model = ModelConfig(
        family="qwen3_moe",
        **model_values(view),
        num_experts=experts,
        first_k_dense=0,
        decoder_sparse_step=view.decoder_sparse_step,
        mlp_only_layers=sorted(set(view.mlp_only_layers)) if experts else [],
        router_topk=view.num_experts_per_tok if experts else 1,
        router_norm_topk_prob=view.norm_topk_prob,
        aux_loss_coeff=view.router_aux_loss_coef,
    )
    return model, MTPConfig(num_layers=view.num_nextn_predict_layers), view.vocab_size


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as Qwen3-MoE."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
