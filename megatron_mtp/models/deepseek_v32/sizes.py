"""Analytic sizes of DeepSeek-V3.2 (models/sizes.py over its table: MLA and the indexer). The
indexer's scores are counted with the attention's (each of its heads scores every earlier token);
decoding keeps one indexer key per token beside MLA's latent and rotary key."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.models import sizes
from megatron_mtp.models.deepseek_v32.hf_mapping import TABLE
from megatron_mtp.models.mla.sizes import attention_score_width as mla_score_width
from megatron_mtp.models.mla.sizes import attention_shape  # noqa: F401  (the family interface)
from megatron_mtp.models.sizes import LayerSizes


def layer_sizes(cfg: Config) -> LayerSizes:
    return sizes.layer_sizes(cfg, TABLE)


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    return sizes.parameter_counts(cfg, padded_vocab, TABLE)


def attention_score_width(cfg: Config) -> int:
    """MLA's score width plus the indexer's (every head's query-key product, with all earlier tokens)."""
    m = cfg.model
    return mla_score_width(cfg) + m.index_n_heads * m.index_head_dim


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    return sizes.training_flops_per_token(cfg, padded_vocab, mtp_layers, TABLE, attention_score_width(cfg))


def kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> int:
    """MLA's latent and rotary key, and the indexer's key."""
    m = cfg.model
    return m.kv_lora_rank + m.qk_pos_emb_head_dim + m.index_head_dim


def decode_attention_flops(cfg: Config, context: int) -> float:
    """The indexer over every cached token, and MLA over the top-k it picks."""
    m = cfg.model
    read = min(context, m.index_topk)
    return 2 * m.index_n_heads * m.index_head_dim * context + \
        2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_pos_emb_head_dim) * read
