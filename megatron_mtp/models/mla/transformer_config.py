"""Translate our typed Config into megatron-core's MLATransformerConfig for the MLA families (the shared fields in
models/megatron_config.py, MLA's here)."""

from __future__ import annotations

from typing import Callable, Optional

from megatron_mtp.config import Config
from megatron_mtp.models.megatron_config import (  # noqa: F401  (megatron_layout, moe_layer_pattern: DeepSeek-V3's tests)
    common_kwargs,
    megatron_layout,
    moe_layer_pattern,
)
from megatron_mtp.platform import Platform
from megatron_mtp.platform.features import Features, resolve_features


def build_transformer_config(cfg: Config, platform: Platform, mtp_loss_scale: float = 0.0,
                             features: Features | None = None, kwargs: Optional[Callable[..., dict]] = None):
    """megatron-core's MLATransformerConfig for this run; `features` defaults to the platform's, `kwargs` (the
    fields of the run, as ``transformer_config_kwargs`` takes its arguments) to MLA's: a family over MLA gives
    its own, MLA's and more (the DSA families' indexer)."""
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    features = features or resolve_features(cfg, platform)
    return MLATransformerConfig(**(kwargs or transformer_config_kwargs)(cfg, platform, features, mtp_loss_scale))


def transformer_config_kwargs(cfg: Config, platform: Platform, features: Features, mtp_loss_scale: float = 0.0) -> dict:
    """The MLATransformerConfig fields of this run (tests check the GPU mapping without a GPU)."""
    m = cfg.model
    return dict(
        common_kwargs(cfg, platform, features, mtp_loss_scale),
        add_qkv_bias=False,
        multi_latent_attention=True,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
        qk_layernorm=True,
        rope_type="yarn" if m.yarn.factor != 1.0 else "rope",
        rotary_base=m.rope_theta,
        rotary_scaling_factor=m.yarn.factor,
        original_max_position_embeddings=m.yarn.original_max_position_embeddings,
        beta_fast=m.yarn.beta_fast,
        beta_slow=m.yarn.beta_slow,
        mscale=m.yarn.mscale,
        mscale_all_dim=m.yarn.mscale_all_dim,
    )
