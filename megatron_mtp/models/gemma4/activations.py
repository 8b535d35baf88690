"""What a Gemma 4 decoder layer saves for the backward (the family's ``saved_layer``): the sandwich-norm layer,
separate q/k/v projections with per-head q/k/v norms and the layer's own RoPE, norms after attention and after
the feed-forward block, a dense GELU-GLU MLP beside the MoE block. The recompute settings leave it as it is
(``sandwich_layer``); the assistant's layers are this layer without its key/value tensors
(mtp_styles/assistant/plan.py ``assistant``)."""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Dims, Kernels, Saved, norm


def glu(out: Saved, name: str, tokens: float, width: int, d: Dims, weighted: bool) -> None:
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
    """One sandwich-norm decoder layer (models/gemma4/ builds it), without recompute. Norms
    keep their input, their rstd and their normalized value; a norm without a weight (v's, the router's)
    keeps only its input and rstd, and an input another op keeps counts once. Checked against real ranks
    (tests/dist/test_plan_exact.py, gemma4 layouts)."""
    out, n, t, a = Saved(), d.local, d.tokens, d.act_bytes
    heads, groups, dim = d.heads, d.kv_heads or d.heads, d.qk_dim
    norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * a)  # the q, k (and v) projections' input
    norm(out, "q_norm", dim, t * heads, d, k)
    norm(out, "k_norm", dim, t * groups, d, k)
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
    norm(out, "post_attention_norm", d.hidden, n, d, k)
    norm(out, "pre_mlp_norm", d.hidden, n, d, k)
    out.add("pre_mlp_norm.output", d.hidden * n * a)
    glu(out, "mlp", t, d.ffn, d, weighted=False)
    if moe:
        norm(out, "post_mlp_norm_1", d.hidden, n, d, k)
        out.add("router.rstd", n * FP32)  # its norm reads the block's input, kept by pre_mlp_norm
        out.add("router.normalized", d.hidden * n * a)
        out.add("router.input", d.hidden * n * a)
        out.add("router", n * (9 * d.experts + 20 * d.topk + 16 * d.groups + 16))
        out.add("router.probs", n * d.experts * FP32)  # before the per-expert scale
        out.add("dispatch.map", n * (5 * d.experts + 8 * d.topk))
        out.add("experts_norm.rstd", n * FP32)
        out.add("experts_norm.normalized", d.hidden * n * a)
        out.add("experts.input", d.routed * d.hidden * a)
        glu(out, "experts", d.routed, d.expert_ffn, d, weighted=True)
        norm(out, "post_mlp_norm_2", d.hidden, n, d, k)
    norm(out, "post_mlp_norm", d.hidden, n, d, k)
    return out


def saved_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute (the recompute settings leave a sandwich layer as it is)."""
    return sandwich_layer(d, k, moe)
