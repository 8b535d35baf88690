"""Translate our typed Config into megatron-core's TransformerConfig with grouped-query attention (the
shared fields in models/megatron_config.py).

Partial RoPE: megatron-core's GPTModel builds its rotary embedding over ``kv_channels x
rotary_percent`` dims with ``inv_freq = 1 / base^(2i / rot_dim)`` and rotates the first ``rot_dim``
dims of each head in the rotate-half (non-interleaved) style, passing the rest through; transformers'
glm4_moe and qwen3_moe do the same with ``partial_rotary_factor``. The q/k norms are built with the per-head
width (``hidden_size_per_attention_head``) and applied per head before RoPE, as transformers' are.
"""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.gqa.model_config import head_dim, query_groups
from megatron_mtp.models.megatron_config import common_kwargs
from megatron_mtp.platform import Platform
from megatron_mtp.platform.features import Features, resolve_features


def build_transformer_config(cfg: Config, platform: Platform, mtp_loss_scale: float = 0.0,
                             features: Features | None = None):
    """megatron-core's TransformerConfig for this run; `features` defaults to the platform's."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    features = features or resolve_features(cfg, platform)
    return TransformerConfig(**transformer_config_kwargs(cfg, platform, features, mtp_loss_scale))


def transformer_config_kwargs(cfg: Config, platform: Platform, features: Features, mtp_loss_scale: float = 0.0) -> dict:
    """The TransformerConfig fields of this run."""
    m = cfg.model
    return dict(
        common_kwargs(cfg, platform, features, mtp_loss_scale),
        num_query_groups=query_groups(m),
        kv_channels=head_dim(m),
        add_qkv_bias=m.add_qkv_bias,
        qk_layernorm=m.qk_layernorm,
        rotary_interleaved=False,  # rotate-half; GPTModel takes rotary_percent and the base (model.py)
    )
