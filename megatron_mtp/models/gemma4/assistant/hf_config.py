"""A Gemma 4 assistant's config.json (transformers' ``Gemma4AssistantConfig``), both ways: what the decoder
and the importer read of it, what an export writes, and the ``mtp.assistant`` shape it describes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from megatron_mtp.errors import UserError
from megatron_mtp.models.gemma4.assistant.model_config import assistant_model
from megatron_mtp.models.gemma4.hf_view import Gemma4HFConfig, parse_hf_config
from megatron_mtp.models.gemma4.model_config import kind_head_dim

MODEL_TYPE = "gemma4_assistant"


@dataclass(frozen=True)
class AssistantConfig:
    """An assistant's config.json: its text stack (a Gemma 4 text view) and the assistant's own fields."""

    text: Gemma4HFConfig
    backbone_hidden_size: int
    use_ordered_embeddings: bool = False
    num_centroids: int = 2048
    centroid_intermediate_top_k: int = 32

    @staticmethod
    def read(raw: dict[str, Any], where: str) -> "AssistantConfig":
        if raw.get("model_type") != MODEL_TYPE or not isinstance(raw.get("text_config"), dict):
            raise UserError(f"{where}: model_type {raw.get('model_type')!r} is not a Gemma 4 assistant "
                            f"({MODEL_TYPE} with a text_config); pass the assistant's directory")
        text = parse_hf_config(dict(raw["text_config"], model_type="gemma4_text"), where)
        if text.n_routed_experts or text.hidden_size_per_layer_input:
            raise UserError(f"{where}: an assistant with experts or per-layer embeddings is not a Gemma 4 assistant")
        return AssistantConfig(text=text, backbone_hidden_size=int(raw.get("backbone_hidden_size", 1536)),
                               use_ordered_embeddings=bool(raw.get("use_ordered_embeddings", False)),
                               num_centroids=int(raw.get("num_centroids", 2048)),
                               centroid_intermediate_top_k=int(raw.get("centroid_intermediate_top_k", 32)))


def assistant_hf_config(cfg, vocab: int, torch_dtype: str) -> dict[str, Any]:
    """config.json of the assistant directory, as transformers' Gemma4AssistantConfig writes it."""
    from megatron_mtp.config.model import MTPConfig
    from megatron_mtp.models.gemma4.hf_config import to_hf_config

    a = cfg.mtp.assistant
    text = to_hf_config(assistant_model(cfg), MTPConfig(num_layers=0), vocab_size=vocab, num_nextn_predict_layers=0,
                        torch_dtype=torch_dtype).to_dict()
    for key in ("architectures", "num_nextn_predict_layers", "torch_dtype", "bos_token_id", "eos_token_id",
                "num_experts", "top_k_experts", "moe_intermediate_size"):
        text.pop(key, None)
    text.update(num_kv_shared_layers=cfg.mtp.assistant.num_layers, vocab_size_per_layer_input=0,
                final_logit_softcapping=None, enable_moe_block=False, tie_word_embeddings=True)
    return {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
            "backbone_hidden_size": cfg.model.hidden_size, "use_ordered_embeddings": bool(a.num_centroids),
            "num_centroids": a.num_centroids or 2048, "centroid_intermediate_top_k": a.centroid_top_k,
            "tie_word_embeddings": True,
            "torch_dtype": torch_dtype, "text_config": text}


def shape_from_hf(raw: dict[str, Any], target, vocab: int, where: str) -> dict[str, Any]:
    """The ``mtp.assistant`` fields (the assistant style's options) of a transformers assistant's config.json
    drafting for the target model config ``target`` of ``vocab`` tokens; one sentence for an assistant this target
    or this trainer cannot take."""
    parsed = AssistantConfig.read(raw, where)
    text = parsed.text
    if parsed.backbone_hidden_size != target.hidden_size or text.vocab_size != vocab:
        raise UserError(f"{where}: the assistant drafts for a model of hidden size {parsed.backbone_hidden_size} and "
                        f"vocabulary {text.vocab_size}, and this target has {target.hidden_size} and {vocab}; pass "
                        "the target's own assistant")
    for kind in set(text.layer_types):
        ours, theirs = (text.global_head_dim, text.head_dim)[kind != "full_attention"], kind_head_dim(target, kind)
        if ours != theirs or kind not in target.layer_kinds():
            raise UserError(f"{where}: the assistant's {kind} layers read head width {ours}, and the target's {kind} "
                            f"layers store {theirs if kind in target.layer_kinds() else 'none'}; pass the target's "
                            "own assistant")
    if parsed.use_ordered_embeddings and vocab % parsed.num_centroids:
        raise UserError(f"{where}: num_centroids {parsed.num_centroids} does not divide the vocabulary of {vocab} "
                        "tokens; a centroid-masked output needs clusters of equal size")
    return dict(hidden_size=text.hidden_size, num_layers=text.num_hidden_layers,
                num_attention_heads=text.num_attention_heads, ffn_hidden_size=text.intermediate_size,
                layer_types=list(text.layer_types),
                num_centroids=parsed.num_centroids if parsed.use_ordered_embeddings else 0,
                centroid_top_k=parsed.centroid_intermediate_top_k)
