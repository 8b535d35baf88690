"""What a grouped-query decoder layer (GLM-4.5, Qwen3-MoE) saves for the backward (the families'
``saved_layer``): the attention with its input norm, then the shared MLP inventories
(models/saved_activations.py)."""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Dims, Kernels, Saved, linear_input, norm, with_mlp


def gqa_attention(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    """Grouped-query self-attention with its input norm (fused into linear_qkv under TE), optional
    per-head q/k norms and partial RoPE. An estimate from the module structure, checked against real
    ranks at one layout (tests/dist/test_plan_exact.py, glm_tp2_ep2: 0.99 and 1.055 of measured)."""
    out, n, a, t = Saved(), d.local, d.act_bytes, d.tokens
    norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * linear_input(d, k))  # linear_qkv's input
    q, kv = t * d.heads * d.qk_dim * a, t * d.kv_heads * d.qk_dim * a
    if d.qk_norm:
        norm(out, "q_norm", d.qk_dim, t * d.heads, d, k)
        norm(out, "k_norm", d.qk_dim, t * d.kv_heads, d, k)
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


def saved_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute."""
    return with_mlp(gqa_attention(d, k, modules), d, k, modules, moe, grouped_gemm)
