"""Our typed Config -> megatron-core's MLATransformerConfig with its DSA fields (MLA's fields,
models/mla/transformer_config.py, plus the indexer's and IndexShare's), for every DSA family.

The indexer scores without the Hadamard rotation (``dsa_indexer_rotate_activation`` off): the rotation
is orthogonal, so it leaves every dot product, and so every score and top-k, as it is (transformers'
indexers leave it out for the same reason); it exists for FP8 scoring kernels, and its kernel
(fast_hadamard_transform) is a CUDA build. The indexer's RoPE is the family's (``INDEXER_ROPE_INTERLEAVED``:
DeepSeek-V3.2 rotates halves, GLM-5 interleaved pairs, as transformers' classes do) while MLA's own is
interleaved in both. IndexShare's frequency and offset are megatron-core's own numbers
(models/dsa/model_config.py).

Layouts. Under TP (with sequence parallelism) the indexer gathers the sequence and runs whole on every tensor
rank, its weights replicated (megatron-core averages their gradients over TP: ``average_gradients_across_tp_domain``);
the attention's heads are split and the KL target summed over TP. Under CP DSAttention has one form,
``cp_comm_type`` "allgather" (every rank gathers the keys in sequence order); megatron-core's schedule scales
an auxiliary loss's backward by CP as it does the main loss's, right for a loss whose ranks' parts sum to the
whole, but each rank's indexer KL is the mean over its own queries, so the scale is divided by CP again.
"""

from __future__ import annotations

from functools import partial

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
    config = mla.build_transformer_config(cfg, platform, mtp_loss_scale, features, kwargs=transformer_config_kwargs)
    if cfg.parallel.context > 1:
        config.experimental_attention_variant_loss_scale_func = partial(_indexer_loss_scale, cfg.parallel.context)
    return config


def _indexer_loss_scale(cp: int, scale) -> None:
    """The indexer loss's backward scale under context parallelism: megatron-core's schedule passes the main
    loss's (times CP, undoing the data × context average of the gradients), but each CP rank's indexer loss is
    the mean over its own queries, so the ranks' gradients are to be averaged: CP is taken back out (module
    note)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossAutoScaler

    DSAIndexerLossAutoScaler.set_loss_scale(scale / cp)


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
        cp_comm_type="allgather",  # DSAttention's one context-parallel form: every rank gathers the keys
    )
    return kwargs | stage_transformer_kwargs(cfg)  # model.dsa_stage: a dense warm-up's top-k, the sparse stage's loss
