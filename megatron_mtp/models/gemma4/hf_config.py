"""Our model config <-> Hugging Face Gemma 4 text config.json (``Gemma4ForCausalLM``, ``gemma4_text``), both
ways, never lossy.

``to_hf_config`` writes the release's spelling of the text model (google/gemma-4-26B-A4B's
``text_config``: ``global_head_dim``, ``num_global_key_value_heads``, ``rope_parameters`` per layer type,
``layer_types``, ``enable_moe_block``, ``top_k_experts``) with per-layer embeddings off, plus
``num_nextn_predict_layers`` for the MTP modules an export holds. ``from_hf_config`` reads a text
config.json or a multimodal one's ``text_config`` through the typed view (hf_view.py) and refuses
in one sentence what our model does not compute: per-layer embeddings, key/value sharing inside the
model, the double-wide MLP, bidirectional attention, attention bias or dropout, another activation.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.gemma4.hf_view import FULL, SLIDING, parse_hf_config, text_config
from megatron_mtp.models.gemma4.model_config import Gemma4ModelConfig as ModelConfig
from megatron_mtp.models.hf_common import (
    IGNORED_ANY_FAMILY,
    NOT_CARRIED_ANY_FAMILY,
    HFConfigFile,
    check_mtp_export,
)
from megatron_mtp.models.hf_common import carry_source_fields as _carry

NOT_CARRIED = {
    **NOT_CARRIED_ANY_FAMILY,
    "per_layer_config": "transformers' spelling of global_head_dim and num_global_key_value_heads",
    "architectures": "exports are Gemma4ForCausalLM",
    "model_type": "exports are gemma4_text",
}
_REFUSED = {
    "hidden_size_per_layer_input": (0, "per-layer embeddings (the E2B/E4B models) are not built"),
    "num_kv_shared_layers": (0, "key/value sharing inside the model (the E2B/E4B models) is not built"),
    "use_double_wide_mlp": (False, "the double-wide MLP goes with key/value sharing, which is not built"),
    "use_bidirectional_attention": (None, "only causal attention is trained"),
    "attention_bias": (False, "Gemma 4 has no attention bias"),
    "attention_dropout": (0.0, "attention dropout is not represented"),
    "hidden_activation": ("gelu_pytorch_tanh", "only GELU-tanh gated MLPs are represented"),
}


def to_hf_config(model: ModelConfig, mtp: MTPConfig, *, vocab_size: int, num_nextn_predict_layers: int,
                 torch_dtype: str = "bfloat16", bos_token_id: Optional[int] = None,
                 eos_token_id: Optional[int] = None) -> HFConfigFile:
    """The HF config of a model with this architecture (vocab from the weights)."""
    check_mtp_export(model, mtp, num_nextn_predict_layers, "Gemma 4")
    if not model.attention_k_eq_v and model.global_query_groups not in (None, model.num_query_groups):
        raise UserError(f"model.global_query_groups={model.global_query_groups} cannot be written in the Gemma 4 "
                        "format without model.attention_k_eq_v (its full layers then share num_key_value_heads); "
                        "set it to null or set model.attention_k_eq_v=true")
    moe = model.num_experts > 0
    values = {
        "architectures": ["Gemma4ForCausalLM"],
        "model_type": "gemma4_text",
        "vocab_size": int(vocab_size),
        "hidden_size": model.hidden_size,
        "intermediate_size": model.ffn_hidden_size,
        "num_hidden_layers": model.num_layers,
        "num_nextn_predict_layers": int(num_nextn_predict_layers),
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.head_dim,
        "global_head_dim": model.global_head_dim,
        "num_global_key_value_heads": (model.global_query_groups or model.num_query_groups)
        if model.attention_k_eq_v else None,
        "attention_k_eq_v": model.attention_k_eq_v,
        "layer_types": model.layer_kinds(),
        "sliding_window": model.sliding_window,
        "rope_parameters": {
            SLIDING: {"rope_type": "default", "rope_theta": model.rope_theta},
            FULL: {"rope_type": "proportional", "partial_rotary_factor": model.global_partial_rotary_factor,
                   "rope_theta": model.global_rope_theta},
        },
        "enable_moe_block": moe,
        "num_experts": model.num_experts if moe else None,
        "top_k_experts": model.router_topk if moe else None,
        "moe_intermediate_size": model.moe_ffn_hidden_size if moe else None,
        "hidden_activation": "gelu_pytorch_tanh",
        "final_logit_softcapping": model.final_logit_softcapping,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "rms_norm_eps": model.norm_epsilon,
        "max_position_embeddings": model.max_position_embeddings,
        "initializer_range": model.init_method_std,
        "tie_word_embeddings": model.tie_embeddings,
        "bos_token_id": bos_token_id,
        "eos_token_id": eos_token_id,
        "torch_dtype": torch_dtype,
        "use_cache": True,
    }
    return HFConfigFile(values)


_KNOWN = frozenset(
    set(NOT_CARRIED) | IGNORED_ANY_FAMILY | {
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "global_head_dim", "num_global_key_value_heads", "hidden_activation",
        "max_position_embeddings", "initializer_range", "rms_norm_eps", "tie_word_embeddings", "rope_parameters",
        "attention_bias", "attention_dropout", "sliding_window", "layer_types", "final_logit_softcapping",
        "use_bidirectional_attention", "vocab_size_per_layer_input", "hidden_size_per_layer_input",
        "attention_k_eq_v", "num_kv_shared_layers", "enable_moe_block", "use_double_wide_mlp", "num_experts",
        "top_k_experts", "moe_intermediate_size", "output_attentions", "per_layer_config", "mtp_per_layer_config",
    })


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF Gemma 4 config.json dict (text or multimodal)."""
    text, _ = text_config(raw, where)
    if not isinstance(text, Mapping):
        raise UserError(f"{where} must hold a JSON object")
    for key in text:
        if key not in _KNOWN:
            raise UserError(f"{where}: field '{key}' is not understood by the converter; it cannot be represented")
    view = parse_hf_config(raw, where)
    for key, (allowed, why) in _REFUSED.items():
        if getattr(view, key) != allowed:
            raise UserError(f"{where}: '{key}' = {getattr(view, key)!r} cannot be represented ({why})")
    moe = bool(view.n_routed_experts)
    vocab = view.vocab_size
    model = ModelConfig(
        family="gemma4",
        num_layers=view.num_hidden_layers,
        hidden_size=view.hidden_size,
        ffn_hidden_size=view.intermediate_size,
        num_attention_heads=view.num_attention_heads,
        num_query_groups=view.num_key_value_heads,
        head_dim=view.head_dim,
        global_head_dim=view.global_head_dim,
        global_query_groups=view.global_kv_heads if view.attention_k_eq_v else None,
        attention_k_eq_v=view.attention_k_eq_v,
        sliding_window=view.sliding_window,
        layer_types=list(view.layer_types),
        rope_theta=view.rope_theta,
        global_rope_theta=view.global_rope_theta,
        global_partial_rotary_factor=view.global_partial_rotary_factor,
        final_logit_softcapping=view.final_logit_softcapping,
        num_experts=view.n_routed_experts,
        router_topk=view.num_experts_per_tok if moe else 1,
        moe_ffn_hidden_size=(view.moe_intermediate_size or 1) if moe else ModelConfig.moe_ffn_hidden_size,
        vocab_size=vocab,
        make_vocab_size_divisible_by=math.gcd(vocab, 128),
        max_position_embeddings=view.max_position_embeddings,
        norm_epsilon=view.rms_norm_eps,
        init_method_std=view.initializer_range,
        tie_embeddings=view.tie_word_embeddings,
    )
    return model, MTPConfig(num_layers=view.num_nextn_predict_layers), vocab


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as Gemma 4 (a multimodal
    source carries nothing: the export is the text model)."""
    if source is not None and text_config(source, "")[1]:
        source = None
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)


TEXT_PREFIX = "model.language_model."
"""Where a multimodal Gemma 4 checkpoint (Gemma4ForConditionalGeneration) keeps the text model's tensors."""


def import_names(raw: Mapping[str, Any]):
    """How a multimodal checkpoint's tensor names become the text model's: ``model.language_model.X`` ->
    ``model.X``, ``lm_head.*`` kept, everything else (the vision and audio towers and their embedders) left
    out (None). None for a text checkpoint, whose names are the text model's already."""
    if not text_config(raw, "config.json")[1]:
        return None

    def rename(name: str) -> Optional[str]:
        if name.startswith(TEXT_PREFIX):
            return "model." + name[len(TEXT_PREFIX):]
        return name if name.startswith("lm_head.") else None

    return rename


def export_names(name: str) -> str:
    """A text-model tensor name -> its name in Gemma4ForConditionalGeneration (``import_names`` reversed)."""
    return TEXT_PREFIX + name[len("model."):] if name.startswith("model.") else name


def multimodal_config(source: Mapping[str, Any], text: Mapping[str, Any]) -> dict[str, Any]:
    """The multimodal config.json ``source`` with the text model ``text`` (a Gemma4ForCausalLM config.json) as its
    text_config; everything else (the towers' configs, the special token ids of images and audio) as it was."""
    inner = {k: v for k, v in text.items() if k not in ("architectures", "torch_dtype", "num_nextn_predict_layers")}
    out = dict(source, text_config=inner)
    out["architectures"] = list(source.get("architectures") or ["Gemma4ForConditionalGeneration"])
    return out
