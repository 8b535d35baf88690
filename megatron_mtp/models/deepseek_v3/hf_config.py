"""Our model config <-> Hugging Face DeepSeek-V3 ``config.json``, both ways, never lossy.

``to_hf_config`` writes every architectural field of ``ModelConfig``/``MTPConfig`` as the official
release spells it (``rope_scaling`` with YaRN, ``topk_method``/``scoring_func``, MTP depth as
``num_nextn_predict_layers``). ``from_hf_config`` reads DeepSeek-V3 and V2-style files (also the
``rope_parameters`` / ``num_mtp_layers`` spellings transformers 5 writes back). A field whose value
our model cannot reproduce is a ``UserError`` naming it: a silently dropped field would give a model
that loads fine and computes something else.

Routing-group subtlety: DeepSeek's reference code, transformers and vLLM score a group by the sum of
its top-2 expert scores (sigmoid) or its top-1 (softmax); megatron-core uses top-(topk/group_topk).
Both agree only when topk/group_topk is 2 (sigmoid) or 1 (softmax), so other settings are refused.
"""

from __future__ import annotations

import math
from typing import Any, Optional

from megatron_mtp.config.model import ModelConfig, MTPConfig, YarnConfig
from megatron_mtp.errors import UserError

# Keys any HF config may carry that say nothing about the architecture.
_IGNORED_HF_KEYS = frozenset(
    {
        "architectures", "model_type", "torch_dtype", "dtype", "transformers_version", "use_cache",
        "bos_token_id", "eos_token_id", "pad_token_id", "auto_map", "quantization_config",
        "_name_or_path", "name_or_path", "output_router_logits", "router_aux_loss_coef",
        "return_dict", "output_hidden_states", "output_attentions", "torchscript", "id2label",
        "label2id", "problem_type", "tokenizer_class", "chunk_size_feed_forward", "is_encoder_decoder",
        "ep_size", "seq_aux", "head_dim", "qk_head_dim", "tf_legacy_loss", "use_bfloat16",
        "initializer_range", "aux_loss_alpha", "rope_theta", "rope_scaling", "rope_parameters",
        "num_nextn_predict_layers", "num_mtp_layers", "moe_layer_freq", "hidden_act",
        "num_key_value_heads", "pretraining_tp", "attention_dropout", "attention_bias",
        "rope_interleave", "scoring_func", "topk_method", "n_group", "topk_group",
    }
)

_SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")


def _check_group_routing(cfg: ModelConfig, where: str) -> None:
    groups = cfg.router_num_groups or 1
    if groups <= 1 or cfg.num_experts == 0:
        return
    group_topk = cfg.router_group_topk or 1
    per_group = cfg.router_topk // group_topk
    wanted = 2 if cfg.router_score_function == "sigmoid" else 1
    if per_group != wanted:
        raise UserError(
            f"{where}: router_topk/router_group_topk = {cfg.router_topk}/{group_topk} makes megatron-core "
            f"score each expert group by its top-{per_group} experts while the Hugging Face DeepSeek "
            f"format scores it by its top-{wanted}; choose router_topk = {wanted} x router_group_topk "
            "or disable groups (router_num_groups: null)"
        )


def to_hf_config(
    model: ModelConfig,
    mtp: MTPConfig,
    *,
    vocab_size: int,
    num_nextn_predict_layers: int,
    torch_dtype: str = "bfloat16",
    bos_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
) -> dict[str, Any]:
    """The ``config.json`` dict for a model with this architecture (vocab from the weights)."""
    if num_nextn_predict_layers > mtp.num_layers:
        raise UserError(
            f"asked for {num_nextn_predict_layers} MTP layers but the config has mtp.num_layers={mtp.num_layers}"
        )
    _check_group_routing(model, "model config")
    moe = model.num_experts > 0
    if moe and model.router_score_function == "sigmoid" and not model.router_enable_expert_bias:
        raise UserError(
            "model.router_enable_expert_bias=false with sigmoid routing cannot be written in the Hugging Face "
            "DeepSeek-V3 format (noaux_tc always reads e_score_correction_bias); enable the expert bias"
        )
    groups = model.router_num_groups or 1
    if model.router_score_function == "sigmoid":
        topk_method = "noaux_tc"
    else:
        topk_method = "group_limited_greedy" if groups > 1 else "greedy"
    yarn = model.yarn
    rope_scaling = None
    if yarn.factor != 1.0:
        rope_scaling = {
            "type": "yarn",
            "rope_type": "yarn",
            "factor": yarn.factor,
            "original_max_position_embeddings": yarn.original_max_position_embeddings,
            "beta_fast": yarn.beta_fast,
            "beta_slow": yarn.beta_slow,
            "mscale": yarn.mscale,
            "mscale_all_dim": yarn.mscale_all_dim,
        }
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": int(vocab_size),
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "moe_intermediate_size": model.moe_ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_nextn_predict_layers": int(num_nextn_predict_layers),
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_attention_heads,
        "q_lora_rank": model.q_lora_rank,
        "kv_lora_rank": model.kv_lora_rank,
        "qk_nope_head_dim": model.qk_head_dim,
        "qk_rope_head_dim": model.qk_pos_emb_head_dim,
        "v_head_dim": model.v_head_dim,
        "n_shared_experts": model.num_shared_experts if moe else None,
        "n_routed_experts": model.num_experts if moe else None,
        "num_experts_per_tok": model.router_topk if moe else None,
        "first_k_dense_replace": model.first_k_dense if moe else model.num_layers,
        "moe_layer_freq": 1,
        "n_group": groups,
        "topk_group": (model.router_group_topk or 1) if groups > 1 else 1,
        "routed_scaling_factor": model.router_topk_scaling_factor,
        "scoring_func": model.router_score_function,
        "topk_method": topk_method,
        "norm_topk_prob": model.router_norm_topk_prob,
        "hidden_act": "silu",
        "rms_norm_eps": model.norm_epsilon,
        "rope_theta": model.rope_theta,
        "rope_scaling": rope_scaling,
        "rope_interleave": True,
        "max_position_embeddings": model.max_position_embeddings,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": model.init_method_std,
        "tie_word_embeddings": model.tie_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": torch_dtype,
        "use_cache": True,
    }


def _require(hf: dict[str, Any], key: str, where: str) -> Any:
    if key not in hf or hf[key] is None:
        raise UserError(f"{where} has no '{key}'; it is required for a DeepSeek-V3/V2 model")
    return hf[key]


def _expect(hf: dict[str, Any], key: str, allowed: tuple, where: str, why: str) -> None:
    if key in hf and hf[key] not in allowed:
        raise UserError(f"{where}: '{key}' = {hf[key]!r} cannot be represented ({why})")


def _yarn_from_hf(hf: dict[str, Any], where: str) -> tuple[float, YarnConfig]:
    params = hf.get("rope_parameters") or {}
    scaling = hf.get("rope_scaling") or {}
    theta = hf.get("rope_theta", params.get("rope_theta", 10000.0))
    source = scaling or params
    kind = source.get("rope_type", source.get("type", "default")) if source else "default"
    if kind in ("default", None):
        return float(theta), YarnConfig()
    if kind != "yarn":
        raise UserError(f"{where}: rope scaling type '{kind}' cannot be represented (only yarn or none)")
    return float(theta), YarnConfig(
        factor=float(source.get("factor", 1.0)),
        original_max_position_embeddings=int(source.get("original_max_position_embeddings", 4096)),
        beta_fast=float(source.get("beta_fast", 32.0)),
        beta_slow=float(source.get("beta_slow", 1.0)),
        mscale=float(source.get("mscale", 1.0)),
        mscale_all_dim=float(source.get("mscale_all_dim", 0.0)),
    )


def from_hf_config(hf: dict[str, Any], where: str = "config.json") -> tuple[ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF DeepSeek-V3/V2 config.json dict."""
    archs = hf.get("architectures") or []
    if archs and not any(a in _SUPPORTED_ARCHITECTURES for a in archs):
        raise UserError(f"{where}: architectures {archs} is not one of {', '.join(_SUPPORTED_ARCHITECTURES)}")
    known = {f for f in ModelConfig.__dataclass_fields__}
    hf_fields = {
        "vocab_size", "hidden_size", "intermediate_size", "moe_intermediate_size", "num_hidden_layers",
        "num_attention_heads", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
        "v_head_dim", "n_shared_experts", "n_routed_experts", "num_experts_per_tok",
        "first_k_dense_replace", "routed_scaling_factor", "norm_topk_prob", "rms_norm_eps",
        "max_position_embeddings", "tie_word_embeddings",
    }
    for key in hf:
        if key not in _IGNORED_HF_KEYS and key not in hf_fields and key not in known:
            raise UserError(f"{where}: field '{key}' is not understood by the converter; it cannot be represented")
    _expect(hf, "moe_layer_freq", (1,), where, "every layer after first_k_dense_replace must be MoE")
    _expect(hf, "hidden_act", ("silu",), where, "only SwiGLU MLPs are supported")
    _expect(hf, "attention_bias", (False, None), where, "attention projections have no bias")
    _expect(hf, "attention_dropout", (0, 0.0, None), where, "attention dropout is not supported")
    _expect(hf, "pretraining_tp", (1, None), where, "pretraining_tp must be 1")
    _expect(hf, "rope_interleave", (True, None), where, "megatron-core MLA expects interleaved rotary weights")
    heads = int(_require(hf, "num_attention_heads", where))
    _expect(hf, "num_key_value_heads", (heads, None), where, "MLA uses as many key/value heads as query heads")
    experts = int(hf.get("n_routed_experts") or 0)
    scoring = hf.get("scoring_func", "softmax" if hf.get("model_type") == "deepseek_v2" else "sigmoid")
    topk_method = hf.get("topk_method", "noaux_tc" if scoring == "sigmoid" else "greedy")
    if experts and topk_method not in ("noaux_tc", "greedy", "group_limited_greedy"):
        raise UserError(f"{where}: 'topk_method' = {topk_method!r} cannot be represented")
    if experts and (topk_method == "noaux_tc") != (scoring == "sigmoid"):
        raise UserError(f"{where}: 'topk_method' = {topk_method!r} with 'scoring_func' = {scoring!r} cannot be represented")
    groups = int(hf.get("n_group") or 1)
    if topk_method == "greedy":
        groups = 1
    theta, yarn = _yarn_from_hf(hf, where)
    num_layers = int(_require(hf, "num_hidden_layers", where))
    first_k = int(hf.get("first_k_dense_replace") or 0)
    if experts == 0:
        first_k = num_layers
    model = ModelConfig(
        num_layers=num_layers,
        hidden_size=int(_require(hf, "hidden_size", where)),
        ffn_hidden_size=int(_require(hf, "intermediate_size", where)),
        num_attention_heads=heads,
        vocab_size=int(_require(hf, "vocab_size", where)),
        make_vocab_size_divisible_by=math.gcd(int(hf["vocab_size"]), 128),
        max_position_embeddings=int(hf.get("max_position_embeddings", 4096)),
        q_lora_rank=hf.get("q_lora_rank"),
        kv_lora_rank=int(_require(hf, "kv_lora_rank", where)),
        qk_head_dim=int(_require(hf, "qk_nope_head_dim", where)),
        qk_pos_emb_head_dim=int(_require(hf, "qk_rope_head_dim", where)),
        v_head_dim=int(_require(hf, "v_head_dim", where)),
        rope_theta=theta,
        yarn=yarn,
        num_experts=experts,
        first_k_dense=first_k if experts else 0,
        moe_ffn_hidden_size=int(hf.get("moe_intermediate_size") or 1),
        num_shared_experts=int(hf.get("n_shared_experts") or 0),
        router_topk=int(hf.get("num_experts_per_tok") or 1),
        router_num_groups=groups if groups > 1 else None,
        router_group_topk=int(hf.get("topk_group") or 1) if groups > 1 else None,
        router_score_function=scoring,
        router_topk_scaling_factor=float(hf.get("routed_scaling_factor", 1.0)),
        router_norm_topk_prob=bool(hf.get("norm_topk_prob", False)),
        router_enable_expert_bias=topk_method == "noaux_tc",
        aux_loss_coeff=float(hf.get("aux_loss_alpha", ModelConfig.aux_loss_coeff)),
        norm_epsilon=float(hf.get("rms_norm_eps", 1e-6)),
        init_method_std=float(hf.get("initializer_range", 0.02)),
        tie_embeddings=bool(hf.get("tie_word_embeddings", False)),
    )
    if experts:
        _check_group_routing(model, where)
    depth = hf.get("num_nextn_predict_layers", hf.get("num_mtp_layers", 0)) or 0
    return model, MTPConfig(num_layers=int(depth)), int(hf["vocab_size"])
