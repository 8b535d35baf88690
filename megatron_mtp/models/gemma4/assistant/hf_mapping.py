"""THE tensor table of the assistant: megatron-core keys (``mtp_assistant.*``, models/gemma4/assistant/
block.py) <-> transformers' ``Gemma4AssistantForCausalLM`` names (its config.json: hf_config.py).

Every assistant tensor is one HF tensor, but the MLP's fc1 (gate rows, then up rows) and the output table,
which transformers ties to ``model.embed_tokens`` (its ``lm_head`` is not written). Tensors split over
tensor-parallel ranks along dim 0 (``tp``): the projections, the column-parallel q/fc1/table, and dim 1 of
the row-parallel o/fc2 (as megatron-core checkpoints them, globally whole, the split is only for ``plan``).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_mtp.models.gemma4.assistant.model_config import assistant_model
from megatron_mtp.models.gemma4.model_config import kind_head_dim
from megatron_mtp.models.tensor_transforms import DIRECT, GATED, Int64, Transform

PREFIX = "mtp_assistant."


@dataclass(frozen=True)
class AssistantTensor:
    mcore: str
    hf: tuple[str, ...]
    """One name, or the (gate, up) halves of dim 0 (``transform``)."""
    shape: tuple[int, ...]
    tp: bool = False
    """Split over the tensor-parallel ranks."""
    buffer: bool = False
    """Not a parameter (``layer_scalar``, ``token_ordering``)."""
    transform: Transform = DIRECT
    """How it becomes its HF tensor(s) and back (models/tensor_transforms.py: the fc1's ``GatedFusion``,
    ``token_ordering``'s ``Int64``)."""


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
                            (2 * a.ffn_hidden_size, h), True, transform=GATED),
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
    ] + ([  # the centroid-masked output (models/gemma4/assistant/centroids.py)
        AssistantTensor(PREFIX + "centroids.weight", ("masked_embedding.centroids.weight",), (clusters, h), True),
        AssistantTensor(PREFIX + "token_ordering", ("masked_embedding.token_ordering",), (vocab,), buffer=True,
                        transform=Int64()),
    ] if (clusters := cfg.mtp.assistant.num_centroids) else [])
