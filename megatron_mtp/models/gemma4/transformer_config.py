"""Translate our typed Config into megatron-core's TransformerConfig for Gemma 4 (the shared fields in
models/megatron_config.py). The attention's per-kind widths travel in the layer specs
(models/gemma4/specs.py); here the config gets the sliding layers' widths (what megatron-core's own
checks read), GELU-tanh for the gated MLPs and the experts, and no position embedding of GPTModel's (each
attention applies its kind's RoPE)."""

from __future__ import annotations

import functools

from megatron_mtp.config import Config
from megatron_mtp.models.megatron_config import common_kwargs
from megatron_mtp.platform import Platform
from megatron_mtp.platform.features import Features, resolve_features


def gelu_tanh(x):
    import torch.nn.functional as F

    return F.gelu(x, approximate="tanh")


def build_transformer_config(cfg: Config, platform: Platform, mtp_loss_scale: float = 0.0,
                             features: Features | None = None):
    """megatron-core's TransformerConfig for this run; `features` defaults to the platform's."""
    from megatron.core.transformer.transformer_config import TransformerConfig

    features = features or resolve_features(cfg, platform)
    m = cfg.model
    kwargs = dict(common_kwargs(cfg, platform, features, mtp_loss_scale),
                  num_query_groups=m.num_query_groups, kv_channels=m.head_dim, qk_layernorm=True,
                  activation_func=functools.partial(gelu_tanh), bias_activation_fusion=False,
                  # the layers differ by kind, so a checkpoint keys each by its number (megatron-core would stack a
                  # model without MoE layers along one axis)
                  hetereogenous_dist_checkpoint=True)
    return TransformerConfig(**kwargs)
