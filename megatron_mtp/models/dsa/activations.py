"""What a DeepSeek Sparse Attention decoder layer (DeepSeek-V3.2, GLM-5) saves for the backward (the families'
``saved_layer``): megatron-core 0.19's absorbed MLA with DSAttention, as it runs here on CPU and GPU alike (its
unfused PyTorch path: ``dsa_kernel_backend`` "none"; the fused TileLang/cuDNN kernels are not wired), then the
shared MLP inventories (models/saved_activations.py). T = tokens of the micro-batch, h heads, a the activation
bytes, c = kv_lora_rank + rope:
  - MLA's norms as models/mla/activations.py (the kv latent goes to the attention without an up-projection,
    so its norm output is not a linear input here); the query up-projection's output [T, h, qk + rope], which
    the absorption (q_nope · W_uk) keeps; the absorbed query [T, h, c] and the latent key [T, c] the scores
    read (in fp32: copies of bf16 ones);
  - the unfused attention over every key, the top-k as a mask: the softmax keeps its exp, the masked
    numerator and the probabilities (three [b, h, s, s] fp32, the last a copy in the compute dtype under
    bf16), its row maxima's indices and the [b, s, s] bool mask; the latent output [T, h, kv_lora] (input of
    the value up-projection) and the attention output [T, h, v];
  - the indexer, only where it learns (``index_trains``: model.indexer_loss_coeff > 0, in a layer that runs
    its own): its query [T, n, d], key [T, d] and head weights [T, n], its key norm's input and statistics,
    the top-k indices (int64 [T, k]) and, under bf16, the compute-dtype absorbed query its KL loss reads;
    otherwise it runs without gradient and keeps nothing.
Under CP (megatron-core's all-gather DSA) this rank's queries read the whole sequence's keys: the key-side
tensors and the score matrices are CP times those of a rank's own tokens. Under TP the heads are split and
the indexer runs whole on every rank (T is the micro-batch's, not the sequence-parallel part).
Recompute: ``core_attn`` checkpoints DSAttention (the indexer with it) and keeps its inputs (the absorbed
query, the latent key), ``layernorm`` keeps the input norm's input (plan/activations.py's note).
"""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Dims, Kernels, Saved, linear_input, norm, with_mlp


def attention(d: Dims, k: Kernels, modules: frozenset) -> Saved:
    """Absorbed MLA with DSAttention and its input norm."""
    out, n, a, t, h = Saved(), d.local, d.act_bytes, d.tokens, d.heads
    latent = d.kv_lora + d.rope_dim
    norm(out, "input_norm", d.hidden, n, d, k)
    out.add("input_norm.output", d.hidden * n * linear_input(d, k))  # q/kv down-projections' and indexer's input
    norm(out, "q_norm", d.q_lora, n, d, k)
    out.add("q_norm.output", d.q_lora * n * linear_input(d, k))  # q up-projection's (and the indexer's) input
    norm(out, "kv_norm", d.kv_lora, n, d, k, input_storage=latent)
    if k.rope == "torch":  # cos and sin for q and for k, [s, 1, 1, rope] in the compute dtype
        out.add("rope.tables", 4 * d.seq * d.rope_dim * a)
    out.add("q.nope", h * t * (d.qk_dim - d.rope_dim) * a)  # the absorption's input, per head
    if "core_attn" in modules:  # the checkpoint keeps DSAttention's inputs
        out.add("qkv.q", t * h * latent * a)
        out.add("qkv.kv", t * latent * a)
    else:
        scores(out, d)
        if d.index_heads and d.index_trains:
            indexer(out, d, k)
    out.add("attn.output", t * h * d.v_dim * a)
    if "layernorm" in modules:
        out.drop("input_norm.")
        out.add("input_norm.input", d.hidden * n * a)
    return out


def scores(out: Saved, d: Dims) -> None:
    """The unfused attention over every key with the top-k as a mask (module note)."""
    a, t, h = d.act_bytes, d.tokens, d.heads
    latent = d.kv_lora + d.rope_dim
    out.add("attn.q", t * h * latent * FP32)  # the scores' fp32 query, one matrix per head
    out.add("attn.k", t * d.cp * h * latent * FP32)  # the latent key (every CP rank's), broadcast to every head
    out.add("attn.v", t * d.cp * h * d.kv_lora * a)  # the latent values, broadcast to every head
    square = d.batch * h * d.seq * d.seq * d.cp  # this rank's queries over the whole sequence's keys
    out.add("attn.probs", square * (3 * FP32 if a == FP32 else 2 * FP32 + a))  # exp, numerator, probabilities
    out.add("attn.masks", 3 * square)  # the inverted mask of each of the softmax's three masked fills
    out.add("attn.row_stats", d.batch * h * d.seq * (8 + FP32 + 1))  # max indices, sums, rows with a key
    out.add("attn.latent_output", h * t * d.kv_lora * a)  # the value up-projection's input


def indexer(out: Saved, d: Dims, k: Kernels) -> None:
    """What a learning indexer and its KL loss keep (module note)."""
    t, a = d.tokens, d.act_bytes
    out.add("indexer.q", t * d.index_heads * d.index_dim * a)
    out.add("indexer.k", t * d.cp * d.index_dim * a)  # gathered over the CP ranks
    out.add("indexer.weights", t * d.index_heads * a)
    out.add("indexer.k_norm", t * (d.index_dim * a + 2 * FP32))  # torch's LayerNorm: its input, mean and 1/std
    if k.rope == "torch":
        out.add("indexer.rope.tables", 4 * d.seq * d.rope_dim * a)
    out.add("indexer.topk", t * min(d.index_topk, d.seq) * 8)
    out.add("indexer.loss_inputs", t * (d.heads + d.cp) * (d.kv_lora + d.rope_dim) * a)  # absorbed query, latent key


def saved_layer(d: Dims, k: Kernels, modules: frozenset, moe: bool, grouped_gemm: bool) -> Saved:
    """One decoder layer without full recompute."""
    return with_mlp(attention(d, k, modules), d, k, modules, moe, grouped_gemm)
