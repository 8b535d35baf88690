"""Our typed Config -> megatron-core's MLATransformerConfig with its DSA fields (MLA's fields,
models/mla/transformer_config.py, plus the indexer's and IndexShare's), for every DSA family.

The indexer scores without the Hadamard rotation (``dsa_indexer_rotate_activation`` off): the rotation
is orthogonal, so it leaves every dot product, and so every score and top-k, as it is (transformers'
indexers leave it out for the same reason); it exists for FP8 scoring kernels, and its kernel
(fast_hadamard_transform) is a CUDA build. The indexer's RoPE is the family's (``INDEXER_ROPE_INTERLEAVED``:
DeepSeek-V3.2 rotates halves, GLM-5 interleaved pairs, as transformers' classes do) while MLA's own is
interleaved in both. IndexShare's frequency and offset are megatron-core's own numbers
(models/dsa/model_config.py).
"""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.dsa.stages import stage_transformer_kwargs
from megatron_mtp.models.mla import transformer_config as mla
from megatron_mtp.platform import Platform
from megatron_mtp.platform.features import Features


def build_transformer_config(cfg: Config, platform: Platform, mtp_loss_scale: float = 0.0,
                             features: Features | None = None):
    """megatron-core's MLATransformerConfig with DeepSeek Sparse Attention for this run (MLA's build, with the
    indexer's fields)."""
    from megatron_mtp.platform.megatron_core import require_dsa

    require_dsa(type(cfg.model).TITLE)
    return mla.build_transformer_config(cfg, platform, mtp_loss_scale, features, kwargs=transformer_config_kwargs)


def transformer_config_kwargs(cfg: Config, platform: Platform, features: Features, mtp_loss_scale: float = 0.0) -> dict:
    """The MLATransformerConfig fields of this run: MLA's and the indexer's."""
    m = cfg.model
    freq, offset = m.index_share()
    kwargs = dict(
        mla.transformer_config_kwargs(cfg, platform, features, mtp_loss_scale),
        experimental_attention_variant="dsa",
        dsa_indexer_n_heads=m.index_n_heads,
        dsa_indexer_head_dim=m.index_head_dim,
        dsa_indexer_topk=m.index_topk,
        dsa_indexer_topk_freq=freq,
        dsa_indexer_skip_topk_offset=offset,
        dsa_indexer_loss_coeff=m.indexer_loss_coeff,
        dsa_indexer_rotate_activation=False,
        dsa_indexer_rope_interleaved=type(m).INDEXER_ROPE_INTERLEAVED,
        dsa_indexer_k_norm_epsilon=1e-6,  # transformers' indexers' k_norm
        apply_rope_fusion=False,
    )
    return kwargs | stage_transformer_kwargs(cfg)  # model.dsa_stage: a dense warm-up's top-k, the sparse stage's loss
