"""THE tensor table of the assistant: megatron-core keys (``mtp_assistant.*``, models/gemma4/assistant/
block.py) <-> transformers' ``Gemma4AssistantForCausalLM`` names, and its config.json both ways.

Every assistant tensor is one HF tensor, but the MLP's fc1 (gate rows, then up rows) and the output table,
which transformers ties to ``model.embed_tokens`` (its ``lm_head`` is not written). Tensors split over
tensor-parallel ranks along dim 0 (``tp``): the projections, the column-parallel q/fc1/table, and dim 1 of
the row-parallel o/fc2 (as megatron-core checkpoints them, globally whole, the split is only for ``plan``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from megatron_mtp.config.assistant import AssistantShape
from megatron_mtp.errors import UserError
from megatron_mtp.models.gemma4.assistant.shape import assistant_model
from megatron_mtp.models.gemma4.model_config import kind_head_dim

PREFIX = "mtp_assistant."


@dataclass(frozen=True)
class AssistantTensor:
    mcore: str
    hf: tuple[str, ...]
    """One name, or the (gate, up) halves of dim 0."""
    shape: tuple[int, ...]
    tp: bool = False
    """Split over the tensor-parallel ranks."""
    buffer: bool = False
    """Not a parameter (``layer_scalar``)."""


def assistant_tensors(cfg, vocab: int) -> list[AssistantTensor]:
    """The assistant's tensors in megatron-core's registration order (``vocab``: the output table's rows)."""
    a, backbone = assistant_model(cfg), cfg.model.hidden_size
    h = a.hidden_size
    out = [AssistantTensor(PREFIX + "pre_projection.weight", ("pre_projection.weight",), (h, 2 * backbone), True)]
    for i, kind in enumerate(a.layer_kinds()):
        m, hf, q = f"{PREFIX}layers.{i}.", f"model.layers.{i}.", a.num_attention_heads * kind_head_dim(a, kind)
        out += [
            AssistantTensor(m + "input_layernorm.weight", (hf + "input_layernorm.weight",), (h,)),
            AssistantTensor(m + "self_attention.linear_q.weight", (hf + "self_attn.q_proj.weight",), (q, h), True),
            AssistantTensor(m + "self_attention.q_layernorm.weight", (hf + "self_attn.q_norm.weight",),
                            (kind_head_dim(a, kind),)),
            AssistantTensor(m + "self_attention.linear_proj.weight", (hf + "self_attn.o_proj.weight",), (h, q), True),
            AssistantTensor(m + "self_attention.post_layernorm.weight", (hf + "post_attention_layernorm.weight",),
                            (h,)),
            AssistantTensor(m + "mlp.pre_feedforward_layernorm.weight", (hf + "pre_feedforward_layernorm.weight",),
                            (h,)),
            AssistantTensor(m + "mlp.mlp.linear_fc1.weight", (hf + "mlp.gate_proj.weight", hf + "mlp.up_proj.weight"),
                            (2 * a.ffn_hidden_size, h), True),
            AssistantTensor(m + "mlp.mlp.linear_fc2.weight", (hf + "mlp.down_proj.weight",), (h, a.ffn_hidden_size),
                            True),
            AssistantTensor(m + "mlp.post_feedforward_layernorm.weight", (hf + "post_feedforward_layernorm.weight",),
                            (h,)),
            AssistantTensor(m + "layer_scalar", (hf + "layer_scalar",), (1,), buffer=True),
        ]
    return out + [
        AssistantTensor(PREFIX + "final_layernorm.weight", ("model.norm.weight",), (h,)),
        AssistantTensor(PREFIX + "post_projection.weight", ("post_projection.weight",), (backbone, h), True),
        AssistantTensor(PREFIX + "output_layer.weight", ("model.embed_tokens.weight",), (vocab, h), True),
    ]


def assistant_hf_config(cfg, vocab: int, torch_dtype: str) -> dict[str, Any]:
    """config.json of the assistant directory, as transformers' Gemma4AssistantConfig writes it."""
    from megatron_mtp.config.model import MTPConfig
    from megatron_mtp.models.gemma4.hf_config import to_hf_config

    text = to_hf_config(assistant_model(cfg), MTPConfig(num_layers=0), vocab_size=vocab, num_nextn_predict_layers=0,
                        torch_dtype=torch_dtype).to_dict()
    for key in ("architectures", "num_nextn_predict_layers", "torch_dtype", "bos_token_id", "eos_token_id",
                "num_experts", "top_k_experts", "moe_intermediate_size"):
        text.pop(key, None)
    text.update(num_kv_shared_layers=cfg.mtp.assistant.num_layers, vocab_size_per_layer_input=0,
                final_logit_softcapping=None, enable_moe_block=False, tie_word_embeddings=True)
    return {"architectures": ["Gemma4AssistantForCausalLM"], "model_type": "gemma4_assistant",
            "backbone_hidden_size": cfg.model.hidden_size, "use_ordered_embeddings": False,
            "num_centroids": 2048, "centroid_intermediate_top_k": 32, "tie_word_embeddings": True,
            "torch_dtype": torch_dtype, "text_config": text}


def shape_from_hf(raw: dict[str, Any], target, vocab: int, where: str) -> AssistantShape:
    """The ``mtp.assistant`` shape of a transformers assistant's config.json drafting for the target model
    config ``target`` of ``vocab`` tokens; one sentence for an assistant this target or this trainer cannot
    take."""
    from megatron_mtp.inference.gemma4_assistant import AssistantConfig

    parsed = AssistantConfig.read(raw, where)
    text = parsed.text
    if parsed.use_ordered_embeddings:
        raise UserError(f"{where}: the assistant's output is centroid-masked (use_ordered_embeddings), which "
                        "training does not learn yet; import an assistant with a full output table")
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
    return AssistantShape(hidden_size=text.hidden_size, num_layers=text.num_hidden_layers,
                          num_attention_heads=text.num_attention_heads, ffn_hidden_size=text.intermediate_size,
                          layer_types=list(text.layer_types))


def num_assistant_tokens(generation_config: Optional[dict[str, Any]], default: int) -> int:
    """Draft tokens per round an assistant's generation_config.json asks for."""
    value = (generation_config or {}).get("num_assistant_tokens")
    return int(value) if isinstance(value, int) and value > 0 else default
