"""What a multi-head latent attention decoder layer (DeepSeek-V3) saves for the backward (the family's
``saved_layer``): MLA with its input norm, then the shared MLP inventories (models/saved_activations.py); the DSA
families' absorbed attention and indexer are models/dsa/activations.py's. Recompute: ``mla_up_proj`` frees
q, k, v after core attention (the compressed q/kv stay), ``core_attn`` keeps q, k, v and drops the kernel's
own tensors, ``layernorm`` keeps the norm's input only (plan/activations.py's note).
"""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Dims, Kernels, Saved, linear_input, norm, with_mlp


def attention(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    """MLA self-attention with its input norm."""
    out, n, a = Saved(), d.local, d.act_bytes
    norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * linear_input(d, k))  # q/kv down-projection input
    if d.q_lora:
        norm(out, "q_norm", d.q_lora, n, d, k)
        out.add("q_norm.output", d.q_lora * n * linear_input(d, k))  # q up-projection input
    norm(out, "kv_norm", d.kv_lora, n, d, k, input_storage=d.kv_lora + d.rope_dim)
    out.add("kv_norm.output", d.kv_lora * n * linear_input(d, k))
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


def saved_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute."""
    return with_mlp(attention(d, k, modules), d, k, modules, moe, grouped_gemm)
