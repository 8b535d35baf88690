"""Our model config <-> Hugging Face DeepSeek-V3 config (``DeepseekV3HFConfig``), both ways, never lossy (the
MLA families' shared base: DeepSeek-V3 reads it as is, DeepSeek-V3.2 adds its indexer's fields).

``to_hf_config`` gives every architectural field of ``ModelConfig``/``MTPConfig`` as the official
release spells it (``rope_scaling`` with YaRN, ``topk_method``/``scoring_func``, MTP depth as
``num_nextn_predict_layers``); its ``to_dict()`` is the config.json. ``from_hf_config`` reads
DeepSeek-V3 and V2-style files through ``parse_hf_config`` (hf_view.py). A field whose value
our model cannot reproduce is a ``UserError`` naming it: a silently dropped field would give a model
that loads fine and computes something else.

Routing-group subtlety: DeepSeek's reference code, transformers and vLLM score a group by the sum of
its top-2 expert scores (sigmoid) or its top-1 (softmax); megatron-core uses top-(topk/group_topk).
Both agree only when topk/group_topk is 2 (sigmoid) or 1 (softmax), so other settings are refused.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import carry_source_fields as _carry
from megatron_mtp.models.hf_common import check_group_routing, check_mtp_export
from megatron_mtp.models.mla.hf_view import READ_KEYS, DeepseekV3HFConfig, YarnScaling, parse_hf_config
from megatron_mtp.models.mla.model_config import MLAModelConfig as ModelConfig
from megatron_mtp.models.mla.model_config import YarnConfig

# Keys any HF config may carry that say nothing about the architecture (the view does not read them).
_IGNORED_HF_KEYS = frozenset(
    {
        "transformers_version", "use_cache", "pad_token_id", "auto_map", "_name_or_path", "name_or_path",
        "output_router_logits", "router_aux_loss_coef", "return_dict", "output_hidden_states",
        "output_attentions", "torchscript", "id2label", "label2id", "problem_type", "tokenizer_class",
        "chunk_size_feed_forward", "is_encoder_decoder", "ep_size", "seq_aux", "head_dim", "qk_head_dim",
        "tf_legacy_loss", "use_bfloat16",
    }
)

_SUPPORTED_ARCHITECTURES = ("DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM")

# Fields of an imported config.json that an export never writes back, and why.
NOT_CARRIED = {
    "quantization_config": "the weights are dequantized on import",
    "auto_map": "the remote-code files it names are not exported",
    "transformers_version": "it records who wrote the source file",
    "_name_or_path": "it records where the source was loaded from",
    "name_or_path": "it records where the source was loaded from",
    "torch_dtype": "the export's --dtype decides",
    "dtype": "the export's --dtype decides (written as torch_dtype)",
    "rope_parameters": "transformers' spelling of rope_scaling + rope_theta, which are written instead",
    "num_mtp_layers": "transformers' spelling of num_nextn_predict_layers",
    "num_nextn_predict_layers": "the export layout decides",
    "architectures": "exports are DeepseekV3ForCausalLM (SGLang's NextN directory: DeepseekV3ForCausalLMNextN)",
    "model_type": "exports are deepseek_v3",
}


def to_hf_config(
    model: ModelConfig,
    mtp: MTPConfig,
    *,
    vocab_size: int,
    num_nextn_predict_layers: int,
    torch_dtype: str = "bfloat16",
    bos_token_id: Optional[int] = None,
    eos_token_id: Optional[int] = None,
) -> DeepseekV3HFConfig:
    """The HF config of a model with this architecture (vocab from the weights)."""
    check_mtp_export(model, mtp, num_nextn_predict_layers, "DeepSeek-V3")
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
        rope_scaling = YarnScaling(**_yarn_fields(yarn))
    return DeepseekV3HFConfig(
        architectures=("DeepseekV3ForCausalLM",),
        model_type="deepseek_v3",
        vocab_size=int(vocab_size),
        hidden_size=model.hidden_size,
        intermediate_size=model.ffn_hidden_size,
        moe_intermediate_size=model.moe_ffn_hidden_size,
        num_hidden_layers=model.num_layers,
        num_nextn_predict_layers=int(num_nextn_predict_layers),
        num_attention_heads=model.num_attention_heads,
        num_key_value_heads=model.num_attention_heads,
        q_lora_rank=model.q_lora_rank,
        kv_lora_rank=model.kv_lora_rank,
        qk_nope_head_dim=model.qk_head_dim,
        qk_rope_head_dim=model.qk_pos_emb_head_dim,
        v_head_dim=model.v_head_dim,
        n_shared_experts=model.num_shared_experts if moe else 0,
        n_routed_experts=model.num_experts if moe else 0,
        num_experts_per_tok=model.router_topk if moe else 1,
        first_k_dense_replace=model.first_k_dense if moe else model.num_layers,
        moe_layer_freq=1,
        n_group=groups,
        topk_group=(model.router_group_topk or 1) if groups > 1 else 1,
        routed_scaling_factor=model.router_topk_scaling_factor,
        scoring_func=model.router_score_function,
        topk_method=topk_method,
        norm_topk_prob=model.router_norm_topk_prob,
        hidden_act="silu",
        rms_norm_eps=model.norm_epsilon,
        rope_theta=model.rope_theta,
        rope_scaling=rope_scaling,
        rope_interleave=True,
        max_position_embeddings=model.max_position_embeddings,
        attention_bias=False,
        attention_dropout=0.0,
        initializer_range=model.init_method_std,
        tie_word_embeddings=model.tie_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        torch_dtype=torch_dtype,
    )


def _refuse(where: str, key: str, value: Any, allowed: tuple, why: str) -> None:
    if value not in allowed:
        raise UserError(f"{where}: '{key}' = {value!r} cannot be represented ({why})")


def _yarn_config(yarn: Optional[YarnScaling]) -> YarnConfig:
    if yarn is None:
        return YarnConfig()
    return YarnConfig(**_yarn_fields(yarn))


# the YaRN settings both sides spell alike (config's YarnConfig, config.json's rope_scaling)
_YARN_FIELDS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow", "mscale", "mscale_all_dim")


def _yarn_fields(yarn) -> dict:
    return {name: getattr(yarn, name) for name in _YARN_FIELDS}


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json",
                   model_class: type = ModelConfig) -> tuple[ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF DeepSeek-V3/V2 config.json dict; the model section is
    a ``model_class`` (the family's MLA model config)."""
    hf = parse_hf_config(raw, where)
    archs = list(hf.architectures)
    if archs and not any(a in _SUPPORTED_ARCHITECTURES for a in archs):
        raise UserError(f"{where}: architectures {archs} is not one of {', '.join(_SUPPORTED_ARCHITECTURES)}")
    known = READ_KEYS | _IGNORED_HF_KEYS | set(model_class.__dataclass_fields__)
    for key in raw:
        if key not in known:
            raise UserError(f"{where}: field '{key}' is not understood by the converter; it cannot be represented")
    _refuse(where, "moe_layer_freq", hf.moe_layer_freq, (1,), "every layer after first_k_dense_replace must be MoE")
    _refuse(where, "hidden_act", hf.hidden_act, ("silu",), "only SwiGLU MLPs are supported")
    _refuse(where, "attention_bias", hf.attention_bias, (False,), "attention projections have no bias")
    _refuse(where, "attention_dropout", hf.attention_dropout, (0.0,), "attention dropout is not supported")
    _refuse(where, "pretraining_tp", hf.pretraining_tp, (1, None), "pretraining_tp must be 1")
    _refuse(where, "rope_interleave", hf.rope_interleave, (True,),
            "megatron-core MLA expects interleaved rotary weights")
    heads = hf.num_attention_heads
    _refuse(where, "num_key_value_heads", hf.num_key_value_heads, (heads, None),
            "MLA uses as many key/value heads as query heads")
    experts, scoring, topk_method = hf.n_routed_experts, hf.scoring_func, hf.topk_method
    if experts and topk_method not in ("noaux_tc", "greedy", "group_limited_greedy"):
        raise UserError(f"{where}: 'topk_method' = {topk_method!r} cannot be represented")
    if experts and (topk_method == "noaux_tc") != (scoring == "sigmoid"):
        raise UserError(
            f"{where}: 'topk_method' = {topk_method!r} with 'scoring_func' = {scoring!r} cannot be represented"
        )
    groups = 1 if topk_method == "greedy" else hf.n_group
    num_layers = hf.num_hidden_layers
    model = model_class(
        num_layers=num_layers,
        hidden_size=hf.hidden_size,
        ffn_hidden_size=hf.intermediate_size,
        num_attention_heads=heads,
        vocab_size=hf.vocab_size,
        make_vocab_size_divisible_by=math.gcd(hf.vocab_size, 128),
        max_position_embeddings=hf.max_position_embeddings,
        q_lora_rank=hf.q_lora_rank,
        kv_lora_rank=hf.kv_lora_rank,
        qk_head_dim=hf.qk_nope_head_dim,
        qk_pos_emb_head_dim=hf.qk_rope_head_dim,
        v_head_dim=hf.v_head_dim,
        rope_theta=hf.rope_theta,
        yarn=_yarn_config(hf.rope_scaling),
        num_experts=experts,
        first_k_dense=hf.first_k_dense_replace if experts else 0,
        moe_ffn_hidden_size=hf.moe_intermediate_size or 1,
        num_shared_experts=hf.n_shared_experts,
        router_topk=hf.num_experts_per_tok,
        router_num_groups=groups if groups > 1 else None,
        router_group_topk=hf.topk_group if groups > 1 else None,
        router_score_function=scoring,
        router_topk_scaling_factor=hf.routed_scaling_factor,
        router_norm_topk_prob=hf.norm_topk_prob,
        router_enable_expert_bias=topk_method == "noaux_tc",
        aux_loss_coeff=hf.aux_loss_alpha if hf.aux_loss_alpha is not None else model_class.aux_loss_coeff,
        norm_epsilon=hf.rms_norm_eps,
        init_method_std=hf.initializer_range,
        tie_embeddings=hf.tie_word_embeddings,
    )
    if experts:
        check_group_routing(model, where)
    return model, MTPConfig(num_layers=hf.num_nextn_predict_layers), hf.vocab_size




def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as DeepSeek-V3."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
