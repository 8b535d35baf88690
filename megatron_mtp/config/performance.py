"""Memory and throughput controls that do not change the model's math: activation recomputation and
fused kernels. Each maps onto a megatron-core TransformerConfig field (models/megatron_config.py);
`auto` is decided by the platform layer (platform/features.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from megatron_mtp.config.parallel import Toggle

RECOMPUTE_MODULES = ("mla_up_proj", "core_attn", "moe_act", "layernorm", "mlp", "moe", "shared_experts")
FAMILY_RECOMPUTE_MODULES = {"mla_up_proj": "MLA's up-projections"}
"""Modules of the list above that only some attentions have; a family's model config names those it has
(``RECOMPUTE_MODULES``)."""


@dataclass
class RecomputeConfig:
    granularity: Literal["none", "selective", "full"] = "none"
    """Activation recomputation: none; selective (the modules below are recomputed in backward
    instead of keeping their activations); full (whole layers, see method and num_layers). MTP
    layers follow the same setting."""
    modules: list[str] = field(default_factory=lambda: ["core_attn"])
    """With selective: any of mla_up_proj (MLA up-projections and RoPE), core_attn, moe_act (routed
    experts' activation, needs grouped GEMM), layernorm, mlp (dense layers), moe (whole MoE layers),
    shared_experts. DeepSeek-V3 recipes: [mla_up_proj, mlp]; on fewer GPUs also moe and layernorm."""
    method: Literal["uniform", "block"] = "uniform"
    """With full: uniform recomputes every layer in chunks of num_layers; block recomputes the first
    num_layers layers of each pipeline stage (MTP layers are then not recomputed)."""
    num_layers: int = 1
    """With full: layers per recomputed chunk (uniform, must be 1 with MTP) or per stage (block)."""


@dataclass
class KernelConfig:
    grouped_gemm: Toggle = "auto"
    """All local experts in one grouped GEMM (Transformer Engine on GPU)."""
    permute_fusion: Toggle = "auto"
    """Fused token permutation of the MoE dispatcher (Transformer Engine >= 2.1)."""
    router_fusion: Toggle = "auto"
    """Fused top-k routing with the score function (Transformer Engine >= 2.6)."""
    router_dtype: Optional[Literal["fp32", "fp64"]] = "fp32"
    """Precision of router logits and routing probabilities (null: the compute dtype). DeepSeek-V3
    recipes route in fp32."""
    cross_entropy_fusion: Literal["auto", "off", "native", "te"] = "auto"
    """Fused vocab-parallel cross entropy: te (Transformer Engine), native (megatron-core's, any
    platform; it keeps the logits gradient in bf16, so fp32 runs are not bitwise equal), off. auto:
    te with Transformer Engine on GPU, else off."""
    chunked_output_loss: Toggle = "auto"
    """The output layer and its cross entropy over chunks of output_loss_chunk tokens, for the main head
    and every MTP depth (both MTP styles, every mtp.targets): one chunk's logits exist at a time, in the
    forward and in the backward, which recomputes them (models/chunked_output_loss.py). auto: on where it
    saves memory (a micro-batch holds more tokens than a chunk) and no fused cross entropy runs
    (cross_entropy_fusion resolves to off); true takes the place of the fused cross entropy."""
    output_loss_chunk: int = 2048
    """Tokens per chunk of chunked_output_loss: its logits, [chunk, vocabulary / TP] in fp32, are the
    largest tensor it makes."""
    rope_fusion: Toggle = "auto"
    """Fused MLA YaRN RoPE kernel (Triton, GPU; needs YaRN rotary settings)."""
    gradient_accumulation_fusion: Toggle = "auto"
    """Accumulate weight gradients into fp32 main grads inside the GEMM (Transformer Engine or apex)."""
    fp8_padding: Toggle = "auto"
    """Pad the routing map so each expert's tokens are a multiple of 16 (needed by FP8 GEMMs;
    auto: on with training.fp8)."""
    cuda_graph: Literal["off", "local", "transformer_engine"] = "off"
    """Capture layers' forward and backward in CUDA graphs (GPU; megatron-core's cuda_graph_impl): local
    (megatron-core's own graphs) or transformer_engine (Transformer Engine's make_graphed_callables). Graphs
    want fixed shapes: an MoE layer is graphed only with model.moe_pad_to_capacity."""
    cuda_graph_scope: Optional[list[str]] = None
    """What cuda_graph captures (megatron-core's cuda_graph_scope): any of attn, mlp, moe, moe_router,
    moe_preprocess (transformer_engine), or full_iteration (local). null: megatron-core's default, whole
    layers."""
