"""Analytic parameter counts and training FLOPs of a grouped-query attention model (models/sizes.py
over the grouped-query tensor table; a family's own MTP names do not change the counts)."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.models import sizes
from megatron_mtp.models.family import AttentionShape
from megatron_mtp.models.gqa.hf_mapping import TABLE
from megatron_mtp.models.gqa.model_config import head_dim, query_groups, rotary_percent
from megatron_mtp.models.sizes import LayerSizes


def layer_sizes(cfg: Config) -> LayerSizes:
    """Parameters of one decoder layer's blocks (models/sizes.py)."""
    return sizes.layer_sizes(cfg, TABLE)


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    """{'main': ..., 'mtp_unique': ..., 'main_active': ...} (MTP shares embedding and head)."""
    return sizes.parameter_counts(cfg, padded_vocab, TABLE)


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """Forward+backward FLOPs per token (models/sizes.py): every query head scores over head_dim and
    reads values of head_dim."""
    width = 2 * cfg.model.num_attention_heads * head_dim(cfg.model)
    return sizes.training_flops_per_token(cfg, padded_vocab, mtp_layers, TABLE, width)


def kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> int:
    """What one layer caches per token when decoding: a key and a value per key/value group."""
    return 2 * query_groups(cfg.model) * head_dim(cfg.model)


def decode_attention_flops(cfg: Config, context: int) -> float:
    """One decoded token's attention scores and values over ``context`` cached tokens, in one layer."""
    return 2 * cfg.model.num_attention_heads * 2 * head_dim(cfg.model) * context


def attention_shape(m) -> AttentionShape:
    """Grouped-query attention's widths: head_dim for queries, keys and values, RoPE over
    rotary_percent of it, the key/value groups, the optional q/k norms."""
    head = head_dim(m)
    return AttentionShape(qk_dim=head, v_dim=head, rope_dim=int(head * rotary_percent(m)),
                          kv_heads=query_groups(m), qk_norm=m.qk_layernorm)
