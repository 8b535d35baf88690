"""Bytes each rank hands to collectives in one training step, by parallel group.

Convention (what tests/dist/scripts/plan_check.py counts): the size of the whole tensor of the
call: an all-gather's output, a reduce-scatter's input, an all-to-all's input, an all-reduce's
tensor, a send's or receive's tensor. On a ring the wire traffic per rank is (n - 1)/n of it.
  tp   sequence-parallel all-gathers before column-parallel linears (again in backward for the
       weight gradient) and reduce-scatters after row-parallel ones; TE builds the MLA
       down-projections duplicated (no communication) where the local spec splits and re-gathers
       them; the embedding's reduce-scatter, the output layer and its cross-entropy reductions; the
       all-reduce of the sequence-parallel (norm and router) weight gradients;
  ep   the token dispatcher's all-to-alls (tokens and routing probabilities, forward and backward);
  etp  with expert TP > 1, the dispatched tokens (and probabilities) gathered over the expert-TP
       group and the expert outputs reduce-scattered back, forward and backward;
  dp   the distributed optimizer's reduce-scatter of every gradient bucket and all-gather of every
       parameter bucket (all-reduce without it), dense buckets over DP, expert buckets over EDP
       (edp); without overlap_param_gather each of the dense and expert optimizers gathers all
       buckets after its step, so with EP > 1 the gather runs twice;
  cp   each layer's keys and values around the ring of Transformer Engine's attention, forward and backward;
       DeepSeek Sparse Attention gathers its keys (and its indexer's) over CP instead (plan/dsa_comm.py, which also
       counts its indexer's TP gathers and KL-target all-reduces and its absorbed kv-latent gather);
  pp   each micro-batch's activation sent forward and its gradient sent back, per chunk boundary;
  embedding  the all-reduce tying the MTP stage's embedding copy to the first stage's.
Small bookkeeping reductions (loss averaging, token counts per expert) are not counted.
With mtp.freeze_base the main model's layers run forward only: their ep/etp all-to-alls and gathers
count once, pipeline activations go forward only, the frozen embedding is not tied by an all-reduce,
and only MTP gradients are reduced (dp/edp from the MTP-only buffers, tp from the MTP norms and
routers); the base layers' tp collectives count their forward alone (each input gathered, each output
reduce-scattered once, the embedding's lookup once). A separate drafter (mtp.style assistant) counts its own
steps (``assistant_tp``, which the style asks for).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from typing import Optional

from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.config.root import Config
from megatron_mtp.models.dsa.stages import INDEXER
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import is_moe_layer, mtp_is_moe
from megatron_mtp.plan import dsa_comm, memory
from megatron_mtp.plan.activations import Dims, dims_of, layer_dims
from megatron_mtp.plan.params import sequential_mtp, trains


def _column(width: float, tokens: int) -> tuple[float, float]:
    """A column-parallel linear on a sequence-parallel input of `width`: the forward gather, the
    backward re-gather for the weight gradient, the input-gradient reduce-scatter."""
    return 2 * tokens * width, tokens * width


def _attention_tp(cfg: Config, d: Dims, te: bool, layer: Optional[int] = None) -> tuple[float, float]:
    """(all-gather, reduce-scatter) elements of one attention block (of decoder layer ``layer``; None: an MTP
    layer), forward and backward."""
    t = d.tokens
    h, q, kv, r = d.hidden, d.q_lora, d.kv_lora, d.rope_dim
    parts = []
    if d.kv_heads is not None:  # grouped-query: one column-parallel linear_qkv (or the family's own projections)
        parts += [_column(h, t)] * cfg.model.attention_input_gathers(layer)
    elif te:  # duplicated down-projections; the up-projections gather the compressed latents
        parts += [_column(q or h, t), _kv_latent(d), (t * r, t * r)]  # + k_pos_emb gather and its backward
    else:  # column-parallel down-projections: their outputs are gathered, then re-split by sequence
        if q:
            parts += [_column(h, t), (2 * t * q, 0), _column(q, t)]
        else:
            parts += [_column(h, t)]
        parts += [_column(h, t), (t * (kv + r) + t * kv, 0), _kv_latent(d)]
    parts.append((t * h, t * h))  # output projection: reduce-scatter, and the gradient's gather
    return sum(p[0] for p in parts), sum(p[1] for p in parts)


def _kv_latent(d: Dims) -> tuple[float, float]:
    """The kv latent's way to the heads over TP: MLA's column-parallel up-projection, or absorbed MLA's (DSA) own
    gather (plan/dsa_comm.py)."""
    return dsa_comm.latent_gather(d) if dsa_comm.is_dsa(d) else _column(d.kv_lora, d.tokens)


def _mlp_tp(d: Dims) -> float:
    """Elements of a column-parallel fc1 and a row-parallel fc2, forward and backward."""
    return sum(_column(d.hidden, d.tokens)) + 2 * d.tokens * d.hidden


def _kv_width(d: Dims) -> float:
    """Key and value elements per token on one TP rank (MLA: the up-projected heads)."""
    heads = d.kv_heads if d.kv_heads is not None else d.heads
    return heads * (d.qk_dim + d.v_dim)


def assistant_tp(cfg: Config, d: Dims) -> float:
    """Bytes of a separate drafter's K steps (mtp.style assistant) on the loss stage, forward and backward: per
    step the target-embedding lookup's reduce-scatter (frozen: no backward), pre_projection (a column-parallel
    [2 h] input, its output gathered over TP and re-split by sequence), each layer's query projection, output
    projection and MLP, post_projection into the next step, and its output table with the cross entropy's
    reductions."""
    family, t, a, h = get_family(cfg.model.family), d.tokens, d.act_bytes, d.hidden
    width = family.style_part(cfg.mtp.style).model(cfg).hidden_size
    drafter = replace(d, hidden=width)
    steps = cfg.mtp.num_layers
    per_step = (t * h + sum(_column(2 * h, t)) + 2 * t * width
                + cfg.mtp.assistant.num_layers * (sum(_column(width, t)) + 2 * t * width + _mlp_tp(drafter))
                + sum(_column(width, t)))
    return (steps * per_step + (steps - 1) * (sum(_column(width, t)) + 2 * t * h)) * a + steps * 3 * t * 4


def step_bytes(cfg: Config, plan: memory.Plan, pp_rank: int) -> Counter:
    """Bytes per group kind ('tp', 'cp', 'ep', 'etp', 'dp', 'edp', 'pp', 'embedding') for `pp_rank`."""
    sizes, tgt = plan.sizes, plan.target
    d = dims_of(cfg, memory.resolve_vocab(cfg), plan.imbalance)
    te, m, a = tgt.te, cfg.model, d.act_bytes
    t, h = d.tokens, d.hidden
    stages = memory.model_stages(cfg)
    mine = [s for s in stages if s.pp_rank == pp_rank]
    micro = plan.num_micro
    out: Counter = Counter()
    tp, ep, etp = sizes.tp > 1, sizes.ep > 1, sizes.etp > 1
    frozen = cfg.mtp.freeze_base  # the base runs forward only
    style = get_style(cfg.mtp.style)
    drafter = cfg.mtp.num_layers and style.separate_drafter  # a model of its own, not layers of the target's kind
    for s in mine:
        layers = ([(i, is_moe_layer(cfg.model, i), frozen) for i in s.layers]
                  + [(None, mtp_is_moe(cfg.model), False)] * (0 if drafter else s.mtp_layers))
        per_micro: Counter = Counter()
        for index, moe, forward_only in layers:
            passes = 1 if forward_only else 2
            dsa = dsa_comm.is_dsa(d)
            own = layer_dims(cfg, d, index) if dsa else d  # a DSA layer's attention, with or without its indexer
            if dsa and tp:  # its indexer's input gathers and KL-target all-reduces
                per_micro["tp"] += dsa_comm.indexer_tp_bytes(own, forward_only)
            if dsa and sizes.cp > 1:  # the all-gathers of its keys (and its indexer's), not a ring
                per_micro["cp"] += dsa_comm.cp_bytes(own, forward_only)
            elif sizes.cp > 1:  # keys and values around the CP ring: CP - 1 hops forward, again with their
                # gradients backward (the ring attention of Transformer Engine)
                per_micro["cp"] += (1 + 2 * (passes - 1)) * (sizes.cp - 1) * t * _kv_width(d) * a
            if tp and forward_only:  # each column-parallel input gathered once, each row-parallel output scattered
                per_micro["tp"] += (cfg.model.attention_input_gathers(index) + 1) * t * h * a
                if not moe or m.num_shared_experts or m.DENSE_MLP_BESIDE_MOE:
                    per_micro["tp"] += 2 * t * h * a
            elif tp:
                per_micro["tp"] += sum(_attention_tp(cfg, d, te, index)) * a
                if not moe or m.num_shared_experts or m.DENSE_MLP_BESIDE_MOE:
                    per_micro["tp"] += _mlp_tp(d) * a
            if moe:
                routed = d.local * d.topk * d.imbalance
                if ep:  # tokens and probabilities out and back, forward and backward
                    per_micro["ep"] += 2 * passes * routed * (h * a + 4)
                if etp:  # tokens and probabilities gathered over expert TP, expert outputs reduce-scattered back
                    per_micro["etp"] += passes * sizes.etp * routed * (2 * h * a + 4)
        if tp:
            modules = s.mtp_layers if sequential_mtp(cfg) else 0  # parallel heads: no lookup, no eh_proj
            lookups = (1 if s.embedding else 0) + modules
            per_micro["tp"] += (1 if frozen else 2) * lookups * t * h * a  # reduce-scatter, and its backward gather
            # eh_proj: a column-parallel [2h] input, its output gathered over TP and re-split by sequence
            per_micro["tp"] += modules * (sum(_column(2 * h, t)) + 2 * t * h) * a
            if s.loss and drafter:  # the frozen target's output layer gathers its input once
                per_micro["tp"] += t * h * a + 3 * t * 4 + (style.plan().drafter_tp(cfg, d) if s.mtp_layers else 0)
            elif s.loss:  # output layer per head, and the cross entropy's three fp32 reductions
                per_micro["tp"] += (1 + cfg.mtp.num_layers) * (sum(_column(h, t)) * a + 3 * t * 4)
        if sizes.pp > 1:
            boundary = d.local * h * a
            first, last = s is stages[0], s is stages[-1]
            per_micro["pp"] += ((0 if last else boundary) + (0 if first else boundary)) * (1 if frozen else 2)
        for kind, nbytes in per_micro.items():
            out[kind] += nbytes * micro
    grad_bytes = 4 if cfg.training.precision == "fp32" or cfg.training.grad_reduce_dtype == "fp32" else 2
    param_bytes = memory.BYTES[cfg.training.precision]
    buffers = memory.rank_buffers(cfg, sizes, pp_rank, tgt, memory.resolve_vocab(cfg))
    # Without overlap_param_gather every distributed optimizer (dense, and expert when EP > 1, built on
    # every rank) starts the all-gather of every bucket after its step: with both, parameters go twice.
    gathers = 1 if cfg.parallel.overlap_param_gather else 1 + (sizes.ep > 1)
    for b in buffers:
        if b.dp == 1:
            continue
        kind = "edp" if b.expert else "dp"
        if cfg.parallel.distributed_optimizer:
            out[kind] += b.numel * grad_bytes + gathers * b.numel * (1 if b.fp8 else param_bytes)
        else:
            out[kind] += sum(e - s for s, e in b.params) * grad_bytes
    if tp:  # sequence-parallel weight gradients (every norm and router weight; a DSA indexer's whole, which
        # megatron-core averages over TP) all-reduced over TP
        sp = sum(p.numel for s in mine for p in memory.chunk_params(cfg, sizes, s, memory.resolve_vocab(cfg),
                                                                     s is stages[-1], te)
                 if (p.name.endswith(("norm.weight", "layer_norm_weight", "router.weight")) or INDEXER in p.name)
                 and trains(cfg, p))
        out["tp"] += sp * grad_bytes
    if sizes.pp > 1 and sequential_mtp(cfg) and not frozen and any(s.embedding or s.mtp_layers for s in mine):
        out["embedding"] += d.vocab * h * grad_bytes
    return out
