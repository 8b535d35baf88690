"""Build the megatron-core GPTModel of one pipeline stage (models/megatron_model.py) with grouped-query
attention and partial (or full) RoPE."""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.gqa.model_config import rotary_percent
from megatron_mtp.models.megatron_model import build_gpt_model
from megatron_mtp.platform import Platform

GQA_KEYS_AS_TE = {"input_layernorm.": "self_attention.linear_qkv.layer_norm_"}
"""TE fuses the layer's input norm into linear_qkv; the local spec keeps it apart."""


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; `config` is the TransformerConfig."""
    return build_gpt_model(cfg, config, platform, vocab_size, pre_process, post_process, vp_stage,
                           keys_as_te=GQA_KEYS_AS_TE, position_embedding_type="rope",
                           rotary_percent=rotary_percent(cfg.model))
