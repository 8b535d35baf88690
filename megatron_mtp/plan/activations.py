"""Bytes each layer saves for backward, per micro-batch and pipeline rank.

Every layer type is an inventory of the tensors its ops keep for backward (names in `Saved`),
sized from the config and the kernels that run (`Kernels`: the GPU plan and the CPU validation
differ only there). Recompute settings drop or replace entries the way megatron-core 0.16.1 does:
  mla_up_proj  CheckpointWithoutOutput around the q/kv up-projections and RoPE: it keeps the
               compressed q/kv (already saved) and frees q, k, v after core attention used them;
  core_attn    checkpoints core attention: keeps q, k, v, drops the kernel's own tensors;
  layernorm    CheckpointWithoutOutput around input_layernorm and pre_mlp_layernorm (the separate
               norm modules; TE fuses a dense layer's pre-MLP norm into fc1, which is not one): keeps
               the norm input, frees its internals and its output (also the copy linears saved);
  mlp          checkpoints the dense MLP: keeps its input;  moe: the whole MoE layer, keeps its input;
  shared_experts / moe_act: the shared experts / the routed experts' activation (grouped GEMM only);
  full         a layer (or a chunk of recompute.num_layers layers) keeps only its input.
A tensor saved by two ops counts once (the same storage); a layer's input is counted by the layer
that saves it (its input norm), so a stage is the sum of its layers.

Sizes per micro-batch: T = seq × micro batch tokens; with sequence parallelism tensors outside
attention/MLP hold T/TP tokens, attention heads and MLP columns are split by TP.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Literal, Optional

from megatron_mtp.config.root import Config
from megatron_mtp.models.family import get_family

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


CPU_KERNELS = Kernels(attention="sdpa_math", norm="torch", swiglu="torch", rope="torch", cross_entropy=None,
                      fp8=False, te_layers=False)


def gpu_kernels(features, fp8: bool) -> Kernels:
    """What a GPU run with Transformer Engine uses (`features` from platform.features)."""
    return Kernels(attention="flash", norm="te", swiglu="fused", rope="fused" if features.rope_fusion else "torch",
                   cross_entropy=features.cross_entropy_fusion, fp8=fp8, te_layers=True,
                   output_chunk=features.output_loss_chunk)


def cpu_kernels(features) -> Kernels:
    """What a CPU run uses (`features` from platform.features)."""
    return replace(CPU_KERNELS, output_chunk=features.output_loss_chunk)


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
    imbalance: float = 1.0
    """Tokens routed to this rank's experts over the balanced average."""
    kv_heads: Optional[int] = None
    """Grouped-query attention (family glm4_moe): key/value heads on this rank; None: MLA."""
    qk_norm: bool = False
    """Grouped-query attention: per-head q/k RMSNorms."""
    sandwich: bool = False
    """A sandwich-norm layer (``sandwich_layer``): separate q/k/v projections with per-head q/k/v norms and the
    layer's own RoPE, norms after attention and after the feed-forward block, a dense GELU-GLU MLP beside
    the MoE block."""
    shares_kv: bool = False
    """Sandwich layers: the keys are the values (no value projection)."""
    softcap: bool = False
    """The logits are soft-capped, c·tanh(z / c): tanh keeps its output for the backward."""

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


def dims_of(cfg: Config, padded_vocab: int, imbalance: float = 1.0, seq: int | None = None,
            batch: int | None = None) -> Dims:
    m, p = cfg.model, cfg.parallel
    tp, etp = p.tensor, p.expert_tensor or p.tensor
    a = get_family(m.family).attention_shape(m)
    attention = _attention_dims(a, tp)
    # context parallelism: a rank holds 1/CP of each sequence (2 chunks); its activations scale with that
    return Dims(seq=(seq or cfg.training.seq_length) // cfg.parallel.context,
                batch=batch or cfg.training.micro_batch_size,
                hidden=m.hidden_size, heads=m.num_attention_heads // tp, **attention,
                ffn=m.ffn_hidden_size // tp, expert_ffn=m.moe_ffn_hidden_size // etp,
                shared_ffn=m.num_shared_experts * m.moe_ffn_hidden_size // tp, experts=m.num_experts,
                topk=m.router_topk, groups=m.router_num_groups or 1, vocab=padded_vocab // tp, tp=tp, etp=etp,
                act_bytes=4 if cfg.training.precision == "fp32" else 2, imbalance=imbalance,
                softcap=getattr(m, "final_logit_softcapping", None) is not None)


def _attention_dims(a, tp: int) -> dict:
    return dict(qk_dim=a.qk_dim, v_dim=a.v_dim, rope_dim=a.rope_dim, q_lora=a.q_lora, kv_lora=a.kv_lora,
                kv_heads=None if a.kv_heads is None else a.kv_heads // tp, qk_norm=a.qk_norm, sandwich=a.sandwich,
                shares_kv=a.shares_kv)


def layer_dims(cfg: Config, d: Dims, layer: Optional[int]) -> Dims:
    """``d`` with decoder layer ``layer``'s attention (None: an MTP layer's), for a family whose layers differ."""
    shape = get_family(cfg.model.family).layer_attention_shape
    return d if shape is None else replace(d, **_attention_dims(shape(cfg.model, layer), cfg.parallel.tensor))


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


def _norm(out: Saved, name: str, width: int, tokens: float, d: Dims, k: Kernels, input_storage: int | None = None):
    """A norm's own saved tensors (not its output). `input_storage`: width of the storage its
    input is a view of (kv_layernorm reads the kv latent out of the joint kv/rope projection)."""
    if k.norm == "te" or d.act_bytes == FP32:  # the input itself is kept (in fp32, torch's x.float() is x)
        out.add(f"{name}.input", (input_storage or width) * tokens * (d.act_bytes if k.norm == "te" else FP32))
    else:  # torch ops in fp32 keep an fp32 copy of a bf16 input
        out.add(f"{name}.input", width * tokens * FP32)
    out.add(f"{name}.rstd", tokens * FP32)
    if k.norm == "torch":
        out.add(f"{name}.normalized", width * tokens * FP32)


def _linear_input(d: Dims, k: Kernels, te_linear: bool = True) -> int:
    return 1 if (k.fp8 and te_linear) else d.act_bytes


def attention(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    """MLA self-attention with its input norm (grouped-query: ``gqa_attention``)."""
    if d.kv_heads is not None:
        return gqa_attention(d, k, modules)
    out, n, a = Saved(), d.local, d.act_bytes
    _norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * _linear_input(d, k))  # q/kv down-projection input
    if d.q_lora:
        _norm(out, "q_norm", d.q_lora, n, d, k)
        out.add("q_norm.output", d.q_lora * n * _linear_input(d, k))  # q up-projection input
    _norm(out, "kv_norm", d.kv_lora, n, d, k, input_storage=d.kv_lora + d.rope_dim)
    out.add("kv_norm.output", d.kv_lora * n * _linear_input(d, k))
    t, heads = d.tokens, d.heads
    if k.rope == "torch":  # cos and sin for q and for k, [s, 1, 1, rope] in the compute dtype
        out.add("rope.tables", 4 * d.seq * d.rope_dim * a)
    q, kk, v = (t * heads * dim * a for dim in (d.qk_dim, d.qk_dim, d.v_dim))
    if "core_attn" in modules:  # the checkpoint keeps q, k, v; the kernel's own tensors are recomputed
        out.add("qkv.q", q)
        out.add("qkv.k", kk)
        out.add("qkv.v", v)
    elif k.attention == "flash":
        out.add("qkv.q", q)
        out.add("qkv.k", kk)
        out.add("qkv.v", v)
        out.add("attn.lse", t * heads * FP32)
    else:  # math SDPA computes in fp32: scaled q, k and probabilities; v is a view of the value tensor in fp32
        scale = FP32 / a
        out.add("attn.q_scaled", q * scale)
        out.add("attn.k_copy", kk * scale)
        out.add("attn.probs", d.batch * heads * d.seq * d.seq * FP32)
        out.add("qkv.v" if a == FP32 else "attn.v_copy", v * scale)
    out.add("attn.output", t * heads * d.v_dim * a)  # kept by the kernel and/or the output projection
    if k.fp8:
        out.add("attn.output_fp8", t * heads * d.v_dim)
    if "mla_up_proj" in modules:  # q, k, v are freed after core attention and recomputed
        out.drop("qkv.")
        if k.rope == "torch":
            out.items["rope.tables"] = d.seq * d.rope_dim * FP32  # the checkpoint keeps the fp32 rotary table
    if "layernorm" in modules:
        out.drop("input_norm.")
        out.add("input_norm.input", d.hidden * n * a)
    return out


def gqa_attention(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    """Grouped-query self-attention with its input norm (fused into linear_qkv under TE), optional
    per-head q/k norms and partial RoPE. An estimate from the module structure, checked against real
    ranks at one layout (tests/dist/test_plan_exact.py, glm_tp2_ep2: 0.99 and 1.055 of measured)."""
    out, n, a, t = Saved(), d.local, d.act_bytes, d.tokens
    _norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * _linear_input(d, k))  # linear_qkv's input
    q, kv = t * d.heads * d.qk_dim * a, t * d.kv_heads * d.qk_dim * a
    if d.qk_norm:
        _norm(out, "q_norm", d.qk_dim, t * d.heads, d, k)
        _norm(out, "k_norm", d.qk_dim, t * d.kv_heads, d, k)
    if k.rope == "torch":
        out.add("rope.tables", 4 * d.seq * d.rope_dim * a)
    if k.attention == "flash" or "core_attn" in modules:  # flash takes the key/value heads as they are
        out.add("qkv.q", q)
        out.add("qkv.k", kv)
        out.add("qkv.v", kv)
        if "core_attn" not in modules:
            out.add("attn.lse", t * d.heads * FP32)
    else:  # math SDPA in fp32 over the key/value heads repeated to the query heads (platform/local_modules.py)
        scale = FP32 / a
        out.add("attn.q_scaled", q * scale)
        out.add("attn.k_copy", q * scale)
        out.add("attn.v_copy", q * scale)
        out.add("attn.probs", d.batch * d.heads * d.seq * d.seq * FP32)
    out.add("attn.output", t * d.heads * d.v_dim * a)
    if k.fp8:
        out.add("attn.output_fp8", t * d.heads * d.v_dim)
    if "layernorm" in modules:
        out.drop("input_norm.")
        out.add("input_norm.input", d.hidden * n * a)
    return out


def _pre_mlp_norm(out: Saved, d: Dims, k: Kernels, modules: frozenset, moe: bool, output_bytes: int) -> None:
    n = d.local
    _norm(out, "mlp_norm", d.hidden, n, d, k)
    out.add("mlp_norm.output", d.hidden * n * output_bytes)
    fused_into_fc1 = k.te_layers and not moe
    if "layernorm" in modules and not fused_into_fc1:
        out.drop("mlp_norm.")
        out.add("mlp_norm.input", d.hidden * n * d.act_bytes)


def _mlp(out: Saved, name: str, tokens: float, width: int, d: Dims, k: Kernels, weighted: bool = False,
         moe_act: bool = False) -> None:
    """fc1 -> SwiGLU -> fc2 columns on `tokens` rows (fc1's input is counted by the caller)."""
    a = d.act_bytes
    out.add(f"{name}.fc1_output", 2 * width * tokens * a)
    if k.swiglu == "torch":  # silu(gate) and the gate copy (+ the product before the prob weighting)
        out.add(f"{name}.swiglu", (3 if weighted else 2) * width * tokens * a)
    if weighted:
        out.add(f"{name}.probs", tokens * FP32)
    if not moe_act:
        out.add(f"{name}.fc2_input", width * tokens * _linear_input(d, k))


def dense_mlp(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    out = Saved()
    _pre_mlp_norm(out, d, k, modules, moe=False, output_bytes=_linear_input(d, k))
    _mlp(out, "mlp", d.tokens, d.ffn, d, k)
    if "mlp" in modules:  # the checkpoint keeps its input: the norm output, or the layer's residual with TE
        out.drop("mlp.", "mlp_norm." if k.te_layers else "mlp.")
        if k.te_layers:
            out.add("mlp_norm.input", d.hidden * d.local * d.act_bytes)
    return out


def moe_mlp(d: Dims, k: Kernels, modules: frozenset, grouped_gemm: bool) -> Saved:
    out, n = Saved(), d.local
    _pre_mlp_norm(out, d, k, modules, moe=True, output_bytes=d.act_bytes)  # the router reads it in bf16
    # router (logits, scores, group and top-k selections) and the dispatcher's routing map
    out.add("router", n * (9 * d.experts + 20 * d.topk + 16 * d.groups + 16))
    out.add("dispatch.map", n * (5 * d.experts + 8 * d.topk))
    routed = d.routed
    out.add("experts.input", routed * d.hidden * _linear_input(d, k))
    moe_act = "moe_act" in modules and grouped_gemm
    _mlp(out, "experts", routed, d.expert_ffn, d, k, weighted=True, moe_act=moe_act)
    if d.shared_ffn:
        if k.fp8:
            out.add("shared.input_fp8", d.hidden * n)
        _mlp(out, "shared", d.tokens, d.shared_ffn, d, k)
        if "shared_experts" in modules:
            out.drop("shared.")
    if "moe" in modules:
        out.drop("router", "dispatch.", "experts.", "shared.")
    return out


def _glu(out: Saved, name: str, tokens: float, width: int, d: Dims, weighted: bool) -> None:
    """fc1 -> GELU(gate) · up (-> × routing probability) -> fc2 on ``tokens`` rows, megatron-core's unfused GLU:
    fc1's output (GELU reads the gate half of it, the product the up half), GELU's output, with ``weighted``
    the product and the probabilities, then fc2's input."""
    a = d.act_bytes
    out.add(f"{name}.fc1_output", 2 * width * tokens * a)
    out.add(f"{name}.gelu_output", width * tokens * a)
    if weighted:
        out.add(f"{name}.product", width * tokens * a)
        out.add(f"{name}.probs", tokens * FP32)
    out.add(f"{name}.fc2_input", width * tokens * a)


def sandwich_layer(d: Dims, k: Kernels, moe: bool) -> Saved:
    """One sandwich-norm decoder layer (``Dims.sandwich``; models/gemma4/ builds it), without recompute. Norms
    keep their input, their rstd and their normalized value; a norm without a weight (v's, the router's)
    keeps only its input and rstd, and an input another op keeps counts once. Checked against real ranks
    (tests/dist/test_plan_exact.py, gemma4 layouts)."""
    out, n, t, a = Saved(), d.local, d.tokens, d.act_bytes
    heads, groups, dim = d.heads, d.kv_heads or d.heads, d.qk_dim
    _norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * a)  # the q, k (and v) projections' input
    _norm(out, "q_norm", dim, t * heads, d, k)
    _norm(out, "k_norm", dim, t * groups, d, k)
    if not d.shares_kv:  # v's own projection output; where keys are values, v's norm reads k's input
        out.add("v_norm.input", t * groups * dim * a)
    out.add("v_norm.rstd", t * groups * FP32)
    out.add("rope.tables", 2 * d.seq * dim * a)  # cos and sin of this layer's RoPE
    scale = FP32 / a
    if k.attention == "flash":
        out.add("qkv.q", t * heads * dim * a)
        out.add("qkv.k", t * groups * dim * a)
        out.add("qkv.v", t * groups * dim * a)
        out.add("attn.lse", t * heads * FP32)
    else:  # math SDPA in fp32 over the key/value heads repeated to the query heads
        out.add("attn.q_scaled", t * heads * dim * a * scale)
        out.add("attn.k_copy", t * heads * dim * a * scale)
        out.add("attn.v_copy", t * heads * dim * a * scale)
        out.add("attn.probs", d.batch * heads * d.seq * d.seq * FP32)
    out.add("attn.output", t * heads * dim * a)
    _norm(out, "post_attention_norm", d.hidden, n, d, k)
    _norm(out, "pre_mlp_norm", d.hidden, n, d, k)
    out.add("pre_mlp_norm.output", d.hidden * n * a)
    _glu(out, "mlp", t, d.ffn, d, weighted=False)
    if moe:
        _norm(out, "post_mlp_norm_1", d.hidden, n, d, k)
        out.add("router.rstd", n * FP32)  # its norm reads the block's input, kept by pre_mlp_norm
        out.add("router.normalized", d.hidden * n * a)
        out.add("router.input", d.hidden * n * a)
        out.add("router", n * (9 * d.experts + 20 * d.topk + 16 * d.groups + 16))
        out.add("router.probs", n * d.experts * FP32)  # before the per-expert scale
        out.add("dispatch.map", n * (5 * d.experts + 8 * d.topk))
        out.add("experts_norm.rstd", n * FP32)
        out.add("experts_norm.normalized", d.hidden * n * a)
        out.add("experts.input", d.routed * d.hidden * a)
        _glu(out, "experts", d.routed, d.expert_ffn, d, weighted=True)
        _norm(out, "post_mlp_norm_2", d.hidden, n, d, k)
    _norm(out, "post_mlp_norm", d.hidden, n, d, k)
    return out


def decoder_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute."""
    if d.sandwich:
        return sandwich_layer(d, k, moe)
    out = attention(d, k, modules)
    mlp = moe_mlp(d, k, modules, grouped_gemm) if moe else dense_mlp(d, k, modules)
    out.items.update(mlp.items)
    return out


def full_recompute_layer(d: Dims) -> Saved:
    """A layer whose whole forward is recomputed keeps its input (hidden states)."""
    out = Saved()
    out.add("layer.input", d.hidden * d.local * d.act_bytes)
    return out


def mtp_wrapper(d: Dims, k: Kernels, full_recompute: bool) -> Saved:
    """An MTP layer's own tensors around its transformer layer: embedding lookup, enorm and hnorm,
    the eh_proj input [embedding; hidden], its final norm."""
    out, n = Saved(), d.local
    out.add("mtp.token_ids", d.tokens * 8)
    if full_recompute:  # the checkpoint keeps its hidden-state and embedding inputs
        out.add("mtp.inputs", 2 * d.hidden * n * d.act_bytes)
        return out
    _norm(out, "mtp.enorm", d.hidden, n, d, k)
    _norm(out, "mtp.hnorm", d.hidden, n, d, k)
    out.add("mtp.eh_proj_input", 2 * d.hidden * n * _linear_input(d, k))
    _norm(out, "mtp.final_norm", d.hidden, n, d, k)
    return out


def assistant(cfg: Config, d: Dims, k: Kernels, steps: int) -> Saved:
    """A separate drafter's K steps on the loss stage (mtp.style assistant, models/gemma4/assistant/): per step
    its projections' inputs, its sandwich layers at its own width with query-only attention (no key/value
    norms; the target's stored keys and values, counted once, are what the query attends to), its final norm
    and its output table's input; the steps' logits are output_and_loss's. Checked against real ranks
    (tests/dist/test_plan_exact.py, gemma4_assistant_tp2_ep2: 0.94 of measured)."""
    family, out = get_family(cfg.model.family), Saved()
    drafter = replace(cfg, model=family.assistant_model(cfg))
    a, n = d.act_bytes, d.local
    for _ in range(steps):
        out.add("pre_projection.input", 2 * d.hidden * n * a)
        for i in range(drafter.model.num_layers):
            layer = layer_dims(drafter, dims_of(drafter, d.vocab * d.tp, seq=d.seq, batch=d.batch), i)
            saved = sandwich_layer(layer, k, moe=False)
            saved.drop("k_norm", "v_norm", "qkv.k", "qkv.v", "attn.k_copy", "attn.v_copy")
            for name, nbytes in saved.items.items():
                out.add(f"layers.{name}", nbytes)
        _norm(out, "final_norm", drafter.model.hidden_size, n, d, k)
        out.add("post_projection.input", drafter.model.hidden_size * n * a)
        out.add("output_layer.input", drafter.model.hidden_size * d.tokens * a)
    stored = {kind: i for kind, i in family.assistant_stored(cfg).items()}
    for kind, index in stored.items():  # the target's keys and values the steps' attention keeps for backward
        shape = layer_dims(cfg, d, index)
        out.add(f"stored_kv.{kind}", (1 if shape.shares_kv else 2) * d.tokens * shape.kv_heads * shape.qk_dim * a)
    return out


def parallel_head(d: Dims, k: Kernels) -> Saved:
    """A parallel MTP head's own tensor around its transformer layer: its final norm (the layer's
    input is the trunk output, which the main output layer saves too)."""
    out = Saved()
    _norm(out, "head.final_norm", d.hidden, d.local, d, k)
    return out


def head_by_head_held(d: Dims, head_grad_bytes: float) -> Saved:
    """mtp.head_by_head_backward: what a micro-batch holds from the forward to its backward instead
    of the heads' activations: the trunk-output gradient and the gradients of the heads' and the
    output layer's parameters (taken in the forward)."""
    out = Saved()
    out.add("heads.trunk_grad", d.hidden * d.local * d.act_bytes)
    out.add("heads.parameter_grads", head_grad_bytes)
    return out


def embedding(d: Dims) -> Saved:
    out = Saved()
    out.add("embedding.token_ids", d.tokens * 8)
    return out


def final_norm(d: Dims, k: Kernels) -> Saved:
    out = Saved()
    _norm(out, "final_norm", d.hidden, d.local, d, k)
    return out


def heads_share_trunk(d: Dims, k: Kernels) -> bool:
    """Whether the main output layer's input is the storage the parallel heads' input norms saved already:
    the trunk output as it is (a norm that keeps its input itself; an output layer that keeps its input
    local, which the chunked loss does not under TP, gathering it)."""
    return (k.norm == "te" or d.act_bytes == FP32) and (not k.output_chunk or d.tp == 1)


def output_and_loss(d: Dims, k: Kernels, mtp_layers: int, main: bool = True, soft: bool = False,
                    trunk_saved: bool = False) -> Saved:
    """Output layer input and cross entropy of the main head (unless `main` is false: a frozen base,
    whose frozen output layer saves no input) and each MTP depth (`soft`: they learn the main model's
    distribution, mtp.targets self or mix). `trunk_saved`: the main call's input is counted by the
    parallel heads (heads_share_trunk)."""
    if k.output_chunk:
        return chunked_output_and_loss(d, mtp_layers, main, soft, trunk_saved)
    out, calls = Saved(), int(main) + mtp_layers
    if main:  # a frozen output layer (no main: the base is frozen) keeps no input for a weight gradient
        # [main; mtp] hidden states
        out.add("output_layer.input", (calls - int(trunk_saved)) * d.hidden * d.local * d.act_bytes)
    logits = d.act_bytes if k.cross_entropy else FP32  # fused: the logits gradient; unfused: fp32 softmax
    out.add("cross_entropy.logits", calls * d.tokens * d.vocab * logits)
    if d.softcap:
        out.add("softcap.tanh", calls * d.tokens * d.vocab * d.act_bytes)
    out.add("cross_entropy.targets", calls * d.tokens * 9)
    out.add("loss", calls * d.tokens * FP32)
    return out


def chunked_output_and_loss(d: Dims, mtp_layers: int, main: bool, soft: bool, trunk_saved: bool = False) -> Saved:
    """kernels.chunked_output_loss (models/chunked_output_loss.py): no logits are kept. Each output-layer
    call keeps its input whole over the sequence (all-gathered under sequence parallelism) to recompute
    its chunks in backward, and per token an fp32 log-sum-exp and the label; a self/mix depth also its
    teacher, the main hidden state rolled to it, and the teacher's log-sum-exp. With a frozen base the
    main call keeps nothing, but at TP1 the depths' inputs are views of the MTP block's one output
    tensor, which holds the main hidden state too."""
    out, calls = Saved(), int(main) + mtp_layers
    held = calls + int(not main and mtp_layers > 0 and d.tp == 1) - int(trunk_saved)
    out.add("chunked_loss.input", held * d.tokens * d.hidden * d.act_bytes)
    out.add("chunked_loss.lse", calls * d.tokens * FP32)
    out.add("chunked_loss.labels", calls * d.tokens * 8)
    if soft:
        out.add("chunked_loss.teacher", mtp_layers * d.tokens * (d.hidden * d.act_bytes + FP32))
    out.add("loss", calls * d.tokens * FP32)  # the per-token loss mask each call's loss is multiplied by
    return out
