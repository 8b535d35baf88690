"""Build the megatron-core GPTModel of one pipeline stage (models/megatron_model.py) with MLA."""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.megatron_model import build_gpt_model
from megatron_mtp.platform import Platform

MLA_KEYS_AS_TE = {
    "self_attention.q_layernorm.": "self_attention.linear_q_up_proj.layer_norm_",
    "self_attention.kv_layernorm.": "self_attention.linear_kv_up_proj.layer_norm_",
}
"""TE fuses MLA's q/kv latent norms into the up-projections; the local spec keeps them apart."""


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; `config` is the MLATransformerConfig."""
    return build_gpt_model(cfg, config, platform, vocab_size, pre_process, post_process, vp_stage,
                           keys_as_te=MLA_KEYS_AS_TE,
                           position_embedding_type="none")  # MLA applies its own (YaRN) rotary embedding
