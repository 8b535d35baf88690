"""Analytic parameter counts and training FLOPs of a Gemma 4 model, summed layer by layer over its kinds
(models/gemma4/hf_mapping.py): the full-attention layers have their own head widths and key/value heads,
and every layer holds the dense MLP and, with experts, the MoE block beside it. Sliding-window layers
score at most ``sliding_window`` keys per query."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.models.family import AttentionShape
from megatron_mtp.models.gemma4.hf_mapping import DENSE, MOE, rules_of_kind
from megatron_mtp.models.gemma4.model_config import (
    MTP_KIND,
    SLIDING,
    kind_groups,
    kind_head_dim,
    kind_shares_kv,
)
from megatron_mtp.models.sizes import LayerSizes, mtp_own_size


def _total(m, rules, *, experts: bool = False) -> int:
    return sum(r.numel(m) for r in rules if r.experts == experts and r.role != "buffer")


def _kind_sizes(cfg: Config, kind: str) -> LayerSizes:
    """One layer of ``kind``; with experts, what every token reads whatever the routing (``around_experts``) holds
    the dense MLP beside them, so the generic consumers (plan --speculative) count it in an MoE layer."""
    m = cfg.model
    moe = m.num_experts > 0
    rules = rules_of_kind(m, kind, moe)
    attention = [r for r in rules if r not in DENSE and r not in MOE]
    expert = _total(m, [r for r in MOE if moe], experts=True)
    dense = _total(m, DENSE)
    around = _total(m, [r for r in MOE if moe]) + dense
    return LayerSizes(attention=_total(m, attention), dense_mlp=dense,
                      moe_total=around + m.num_experts * expert, moe_active=around + m.router_topk * expert,
                      norms=0, expert=expert, around_experts=around)


def layer_sizes(cfg: Config) -> LayerSizes:
    """One sliding-window layer's blocks (the most common kind; parameter_counts sums every kind)."""
    return _kind_sizes(cfg, SLIDING)


def _layer_params(cfg: Config, kind: str, active: bool) -> int:
    s = _kind_sizes(cfg, kind)
    if not cfg.model.num_experts:
        return s.attention + s.dense_mlp
    return s.attention + (s.moe_active if active else s.moe_total)


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    """{'main', 'main_active', 'mtp_unique'}: embeddings tied unless model.tie_embeddings is false."""
    m = cfg.model
    embed = padded_vocab * m.hidden_size
    head = 0 if m.tie_embeddings else embed
    kinds = m.layer_kinds()
    main = sum(_layer_params(cfg, k, False) for k in kinds) + embed + head + m.hidden_size
    active = sum(_layer_params(cfg, k, True) for k in kinds) + embed + head + m.hidden_size
    mtp = cfg.mtp.modules * (_layer_params(cfg, MTP_KIND, False) + mtp_own_size(cfg))
    return {"main": main, "main_active": active, "mtp_unique": mtp}


def _scored_keys(cfg: Config, kind: str) -> float:
    """Keys a query scores on average over a causal sequence (a sliding layer: at most its window)."""
    seq = cfg.training.seq_length
    if kind == SLIDING and cfg.model.sliding_window < seq:
        w = cfg.model.sliding_window
        return (w * (w + 1) / 2 + (seq - w) * w) / seq
    return (seq + 1) / 2


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """Forward+backward FLOPs per token (3 × forward): the matmuls of each layer's active parameters and
    its attention scores and values over the keys it sees."""
    m = cfg.model

    def layer(kind: str) -> float:
        width = 2 * m.num_attention_heads * kind_head_dim(m, kind)
        return 2 * _layer_params(cfg, kind, True) + 2 * width * _scored_keys(cfg, kind)

    head = 2 * padded_vocab * m.hidden_size
    forward = sum(layer(k) for k in m.layer_kinds()) + head
    forward += mtp_layers * (layer(MTP_KIND) + 2 * 2 * m.hidden_size * m.hidden_size + head)
    return 3.0 * forward


def _kind_kv(m, kind: str) -> int:
    """Elements one layer of ``kind`` caches per token it keeps (keys only where keys are values)."""
    return (1 if kind_shares_kv(m, kind) else 2) * kind_groups(m, kind) * kind_head_dim(m, kind)


def _kept(cfg: Config, kind: str, context: int) -> float:
    """The share of ``context`` cached tokens a layer of ``kind`` keeps (a sliding layer: its window)."""
    return min(1.0, cfg.model.sliding_window / context) if kind == SLIDING else 1.0


def kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> int:
    """What a layer caches per token of ``context`` (default training.seq_length), averaged over the layers: a
    sliding layer keeps only its window, a full layer whose keys are its values keeps keys alone."""
    m, context = cfg.model, context or cfg.training.seq_length
    kinds = m.layer_kinds()
    return round(sum(_kind_kv(m, k) * _kept(cfg, k, context) for k in kinds) / len(kinds))


def decode_attention_flops(cfg: Config, context: int) -> float:
    """One decoded token's scores and values over ``context`` cached tokens, averaged over the layers (a sliding
    layer scores at most its window)."""
    m = cfg.model
    kinds = m.layer_kinds()
    return sum(2 * m.num_attention_heads * 2 * kind_head_dim(m, k) * context * _kept(cfg, k, context)
               for k in kinds) / len(kinds)


def _kind_shape(m, kind: str) -> AttentionShape:
    d = kind_head_dim(m, kind)
    return AttentionShape(qk_dim=d, v_dim=d, rope_dim=d, kv_heads=kind_groups(m, kind), qk_norm=True,
                          shares_kv=kind_shares_kv(m, kind))


def attention_shape(m) -> AttentionShape:
    """The sliding-window layers' widths (the common kind; ``layer_attention_shape`` gives each layer's)."""
    return _kind_shape(m, SLIDING)


def layer_attention_shape(m, layer) -> AttentionShape:
    """Decoder layer ``layer``'s attention widths (None: an MTP layer, built as the last layer is)."""
    return _kind_shape(m, MTP_KIND if layer is None else m.layer_kinds()[layer])
