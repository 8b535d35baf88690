"""Analytic parameter counts and training FLOPs of the DeepSeek-V3 model (models/sizes.py over the
MLA tensor table)."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.models import sizes
from megatron_mtp.models.deepseek_v3.hf_mapping import TABLE
from megatron_mtp.models.mla.sizes import attention_score_width, attention_shape  # noqa: F401  (the family interface)
from megatron_mtp.models.sizes import LayerSizes


def layer_sizes(cfg: Config) -> LayerSizes:
    """Parameters of one decoder layer's blocks (models/sizes.py)."""
    return sizes.layer_sizes(cfg, TABLE)


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    """{'main': ..., 'mtp_unique': ..., 'main_active': ...} (MTP shares embedding and head)."""
    return sizes.parameter_counts(cfg, padded_vocab, TABLE)


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """Forward+backward FLOPs per token (models/sizes.py)."""
    return sizes.training_flops_per_token(cfg, padded_vocab, mtp_layers, TABLE, attention_score_width(cfg))


def kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> int:
    """What one layer caches per token when decoding: MLA's compressed latent and the shared rotary
    key (the absorbed form vLLM and SGLang serve DeepSeek-V3 with)."""
    return cfg.model.kv_lora_rank + cfg.model.qk_pos_emb_head_dim


def decode_attention_flops(cfg: Config, context: int) -> float:
    """One decoded token's attention scores and values over ``context`` cached tokens, in one layer
    (MLA: per head, over the latent plus the rotary part, as the absorbed form computes it)."""
    m = cfg.model
    return 2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_pos_emb_head_dim) * context
