"""What the memory plan's activation inventories are made of (plan/activations.py): the kernels whose saved
tensors differ between platforms (``Kernels``), one micro-batch's per-rank shapes (``Dims``), one layer's saved
tensors (``Saved``), and the parts every family's decoder layer shares: norms, linear inputs, the dense and the
routed MLP. A family's attention inventory and its ``saved_layer`` (a ``Family`` member) live in its folder
(models/mla/activations.py: MLA; models/gqa/activations.py: grouped-query attention;
models/gemma4/activations.py: the sandwich-norm layer); plan/activations.py's module note says which recompute
setting drops what.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

FP32 = 4


@dataclass(frozen=True)
class Kernels:
    """The kernels whose saved tensors differ between platforms."""

    attention: Literal["flash", "sdpa_math"] = "flash"
    """flash: a fused attention kernel (TE/cuDNN, FlashAttention) keeping q, k, v, the output and
    the fp32 log-sum-exp; sdpa_math: torch's math SDPA (CPU, q and v head dims differ) keeping a
    scaled q copy, a k copy, v and the softmax probabilities (b·heads·s² elements)."""
    norm: Literal["te", "torch"] = "te"
    """te: RMSNorm keeps its input and the fp32 1/rms; torch: the project's RMSNorm in fp32 ops
    keeps fp32 copies of the input and of x/rms."""
    swiglu: Literal["fused", "torch"] = "fused"
    """fused: megatron-core's fused (weighted) SwiGLU keeps only its input; torch: silu, the
    gate copy and (experts) the unweighted product are kept too."""
    rope: Literal["fused", "torch"] = "fused"
    """torch: cos/sin tables are kept per layer (fp32, per sequence position)."""
    cross_entropy: Optional[Literal["te", "native"]] = "te"
    """None: megatron-core's vocab-parallel cross entropy keeps the fp32 softmax; te/native: the
    fused kernels keep the logits gradient in the compute dtype."""
    fp8: bool = False
    """Transformer Engine linear layers keep their inputs quantized to FP8 (1 byte)."""
    te_layers: bool = True
    """Transformer Engine specs: a dense layer's pre-MLP norm is fused into fc1."""
    output_chunk: Optional[int] = None
    """Tokens per chunk of the chunked output-layer loss (kernels.chunked_output_loss); None: whole logits."""


@dataclass(frozen=True)
class Dims:
    """Per-rank shapes of one micro-batch."""

    seq: int
    batch: int
    hidden: int
    heads: int
    """Attention heads on this rank (heads / TP)."""
    qk_dim: int
    """Query/key head dim including the rotary part."""
    v_dim: int
    rope_dim: int
    q_lora: Optional[int]
    kv_lora: int
    ffn: int
    """Dense MLP columns on this rank (ffn / TP)."""
    expert_ffn: int
    """Routed expert columns on this rank (moe_ffn / expert TP)."""
    shared_ffn: int
    """Shared expert columns on this rank (shared × moe_ffn / TP)."""
    experts: int
    topk: int
    groups: int
    vocab: int
    """Output-layer rows on this rank (padded vocab / TP)."""
    tp: int
    etp: int
    act_bytes: int
    """Bytes of an activation element (2 in bf16/fp16, 4 in fp32)."""
    family: str
    """``model.family``: whose ``saved_layer`` inventories a decoder layer (models/family.py)."""
    imbalance: float = 1.0
    """Tokens routed to this rank's experts over the balanced average."""
    kv_heads: Optional[int] = None
    """Grouped-query attention (GLM-4.5, Qwen3-MoE, Gemma 4): key/value heads on this rank; None: MLA."""
    qk_norm: bool = False
    """Grouped-query attention: per-head q/k RMSNorms."""
    shares_kv: bool = False
    """The keys are the values (no value projection; Gemma 4's full-attention layers)."""
    softcap: bool = False
    """The logits are soft-capped, c·tanh(z / c): tanh keeps its output for the backward."""
    index_heads: int = 0
    """DeepSeek Sparse Attention: the layer's lightning indexer heads (0: none; models/dsa/activations.py)."""
    index_dim: int = 0
    """DSA: width of one indexer head."""
    index_topk: int = 0
    """DSA: earlier tokens each query reads (0: dense attention)."""
    index_trains: bool = False
    """DSA: the indexer learns from its KL loss (its tensors are kept for the backward)."""
    cp: int = 1
    """Context-parallel ranks: ``seq`` is this rank's part; an attention that gathers the keys (DSA) holds CP × seq."""

    @property
    def tokens(self) -> int:
        return self.seq * self.batch

    @property
    def local(self) -> int:
        """Tokens of sequence-parallel tensors on this rank."""
        return self.tokens // self.tp

    @property
    def routed(self) -> float:
        """Token copies this rank's experts process (balanced: local tokens × top-k)."""
        return self.local * self.topk * self.etp * self.imbalance


@dataclass
class Saved:
    """One layer's saved tensors: name -> bytes."""

    items: dict[str, float] = field(default_factory=dict)

    def add(self, name: str, nbytes: float) -> None:
        self.items[name] = self.items.get(name, 0) + nbytes

    def drop(self, *prefixes: str) -> None:
        for name in [n for n in self.items if n.startswith(prefixes)]:
            del self.items[name]

    @property
    def total(self) -> float:
        return sum(self.items.values())


def norm(out: Saved, name: str, width: int, tokens: float, d: Dims, k: Kernels, input_storage: int | None = None):
    """A norm's own saved tensors (not its output). `input_storage`: width of the storage its
    input is a view of (kv_layernorm reads the kv latent out of the joint kv/rope projection)."""
    if k.norm == "te" or d.act_bytes == FP32:  # the input itself is kept (in fp32, torch's x.float() is x)
        out.add(f"{name}.input", (input_storage or width) * tokens * (d.act_bytes if k.norm == "te" else FP32))
    else:  # torch ops in fp32 keep an fp32 copy of a bf16 input
        out.add(f"{name}.input", width * tokens * FP32)
    out.add(f"{name}.rstd", tokens * FP32)
    if k.norm == "torch":
        out.add(f"{name}.normalized", width * tokens * FP32)


def linear_input(d: Dims, k: Kernels, te_linear: bool = True) -> int:
    return 1 if (k.fp8 and te_linear) else d.act_bytes


def pre_mlp_norm(out: Saved, d: Dims, k: Kernels, modules: frozenset, moe: bool, output_bytes: int) -> None:
    n = d.local
    norm(out, "mlp_norm", d.hidden, n, d, k)
    out.add("mlp_norm.output", d.hidden * n * output_bytes)
    fused_into_fc1 = k.te_layers and not moe
    if "layernorm" in modules and not fused_into_fc1:
        out.drop("mlp_norm.")
        out.add("mlp_norm.input", d.hidden * n * d.act_bytes)


def mlp(out: Saved, name: str, tokens: float, width: int, d: Dims, k: Kernels, weighted: bool = False,
         moe_act: bool = False) -> None:
    """fc1 -> SwiGLU -> fc2 columns on `tokens` rows (fc1's input is counted by the caller)."""
    a = d.act_bytes
    out.add(f"{name}.fc1_output", 2 * width * tokens * a)
    if k.swiglu == "torch":  # silu(gate) and the gate copy (+ the product before the prob weighting)
        out.add(f"{name}.swiglu", (3 if weighted else 2) * width * tokens * a)
    if weighted:
        out.add(f"{name}.probs", tokens * FP32)
    if not moe_act:
        out.add(f"{name}.fc2_input", width * tokens * linear_input(d, k))


def dense_mlp(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    out = Saved()
    pre_mlp_norm(out, d, k, modules, moe=False, output_bytes=linear_input(d, k))
    mlp(out, "mlp", d.tokens, d.ffn, d, k)
    if "mlp" in modules:  # the checkpoint keeps its input: the norm output, or the layer's residual with TE
        out.drop("mlp.", "mlp_norm." if k.te_layers else "mlp.")
        if k.te_layers:
            out.add("mlp_norm.input", d.hidden * d.local * d.act_bytes)
    return out


def moe_mlp(d: Dims, k: Kernels, modules: frozenset, grouped_gemm: bool) -> Saved:
    out, n = Saved(), d.local
    pre_mlp_norm(out, d, k, modules, moe=True, output_bytes=d.act_bytes)  # the router reads it in bf16
    # router (logits, scores, group and top-k selections) and the dispatcher's routing map
    out.add("router", n * (9 * d.experts + 20 * d.topk + 16 * d.groups + 16))
    out.add("dispatch.map", n * (5 * d.experts + 8 * d.topk))
    routed = d.routed
    out.add("experts.input", routed * d.hidden * linear_input(d, k))
    moe_act = "moe_act" in modules and grouped_gemm
    mlp(out, "experts", routed, d.expert_ffn, d, k, weighted=True, moe_act=moe_act)
    if d.shared_ffn:
        if k.fp8:
            out.add("shared.input_fp8", d.hidden * n)
        mlp(out, "shared", d.tokens, d.shared_ffn, d, k)
        if "shared_experts" in modules:
            out.drop("shared.")
    if "moe" in modules:
        out.drop("router", "dispatch.", "experts.", "shared.")
    return out


def with_mlp(out: Saved, d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """A pre-norm decoder layer: ``out`` (its attention's inventory) and its routed or dense MLP's."""
    mlp_saved = moe_mlp(d, k, modules, grouped_gemm) if moe else dense_mlp(d, k, modules)
    out.items.update(mlp_saved.items)
    return out
