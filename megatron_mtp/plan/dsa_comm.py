"""What a DeepSeek Sparse Attention layer (the DSA families: megatron-core 0.19's ``AbsorbedMLASelfAttention`` with
``DSAttention`` and its ``DSAIndexer``) hands to collectives where it differs from dense MLA, per micro-batch, in
plan/comm.py's convention (the whole tensor of the call: an all-gather's output, a reduce-scatter's input, an
all-reduce's tensor). T = the tokens of a CP rank's micro-batch (what a sequence-parallel gather puts together),
a = the activation bytes. Read from megatron-core 0.19's experimental_attention_variant/dsa.py and absorbed_mla.py.

Context parallelism. DSAttention runs ``cp_comm_type`` "allgather" alone (models/dsa/transformer_config.py sets
it), not Transformer Engine's ring, so no key or value goes around a ring. In ``DSAttention.forward``:
  - the absorbed key [T, kv_lora + rope] (the latent and the rotary key; the value is None, read from the latent)
    goes through ``gather_from_sequence_parallel_region`` over CP: an all-gather of CP·T rows forward and the
    reduce-scatter of its gradient backward;
  - in a layer that runs its own indexer, the indexer's key [T, index_head_dim] likewise, forward; its backward
    reduce-scatter runs only where the indexer learns from its KL loss (``use_indexer_loss``: the key takes a
    gradient from nothing else). A layer that reuses an earlier top-k (IndexShare) gathers no indexer key.
Tensor parallelism (sequence parallelism, which AbsorbedMLA requires under TP):
  - ``get_query_key_value_tensors`` gathers the normed kv latent itself (``gather_from_sequence_parallel_region``:
    T·kv_lora forward, its reduce-scatter backward) instead of a column-parallel up-projection, which would gather
    it again in the backward for its weight gradient: ``latent_gather`` (plan/comm.py's MLA count uses it);
  - ``DSAIndexer.forward_before_topk`` gathers its inputs over TP, the hidden states [T, h] and the query latent
    [T, q_lora], forward only: DSAttention detaches both first, so no gradient is reduce-scattered back;
  - the indexer's KL target, the main attention's probabilities summed over this rank's heads, [b, s/CP, s] in
    fp32, is all-reduced over TP in the loss's forward (``compute_dsa_indexer_loss``) and again in its backward,
    which recomputes it (``bwd_fused_indexer_loss_naive``); only where the indexer learns;
  - the indexer's weight gradients (marked ``average_gradients_across_tp_domain``) are all-reduced over TP with
    the sequence-parallel norms' (finalize_model_grads): plan/comm.py adds them to that count.
A forward-only layer (mtp.freeze_base) gathers forward alone and computes no indexer loss.
"""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Dims


def is_dsa(d: Dims) -> bool:
    """Whether ``d`` is a DSA layer's (an indexer width is set; IndexShare's layers have no heads but the width)."""
    return d.index_dim > 0


def learns(d: Dims, forward_only: bool) -> bool:
    """Whether the layer's indexer runs its KL loss (and so its backward) in this step."""
    return bool(d.index_heads) and d.index_trains and not forward_only


def cp_bytes(d: Dims, forward_only: bool) -> float:
    """The CP all-gathers of one layer (``d``: its layer dims) and their backward reduce-scatters (module note)."""
    if d.cp == 1:
        return 0.0
    gathered = d.cp * d.tokens * d.act_bytes  # bytes per element of width: every CP rank's rows
    out = (1 if forward_only else 2) * gathered * (d.kv_lora + d.rope_dim)
    if d.index_heads:
        out += (2 if learns(d, forward_only) else 1) * gathered * d.index_dim
    return out


def indexer_tp_bytes(d: Dims, forward_only: bool) -> float:
    """The indexer's TP collectives in one layer: its input gathers and the KL target's all-reduces (module note)."""
    if d.tp == 1 or not d.index_heads:
        return 0.0
    out = d.tokens * (d.hidden + d.q_lora) * d.act_bytes
    if learns(d, forward_only):
        out += 2 * d.tokens * d.cp * d.seq * FP32  # [b, s/CP, s]: b·s/CP = T, the keys the whole sequence
    return out


def latent_gather(d: Dims) -> tuple[float, float]:
    """(all-gather, reduce-scatter) elements of the kv latent's TP gather (module note)."""
    return d.tokens * d.kv_lora, d.tokens * d.kv_lora
