"""Analytic sizes of the DSA families (models/sizes.py over their table: MLA and the indexer), and what sparse
attention costs beside dense MLA.

Parameters: a layer's table has its indexer only where it runs one (``runs_indexer``; GLM-5's IndexShare
layers reuse an earlier top-k), so the counts take each shared layer's indexer off the shared-layer sum.

Training FLOPs (models/throughput.py's definition, 3 × the forward): the weights' matmuls as every family's,
and per token and layer, causally (a query at position t sees t earlier tokens, L/2 on average):
  - the indexer, in a layer that runs one: each of its heads' query-key product with every earlier token,
    then the weighted sum over heads: 2 · index_n_heads · (index_head_dim + 1) · L/2;
  - the main attention over the top-k alone, as megatron-core's absorbed MLA computes it: scores over the
    latent and the rotary key, values in the latent, 2 · heads · (2 · kv_lora_rank + rope) · keys, where
    keys = min(t, k) averaged over the positions: L/2 up to k = L, then k − k² / (2L) (``sparse_keys``).
Dense MLA (the same model without DSA, as megatron-core trains DeepSeek-V3: no absorption) scores
2 · heads · (qk + rope + v) · L/2. The indexer's own backward runs only with its KL loss
(model.indexer_loss_coeff > 0), and the loss's target (the main attention's distribution) is not counted,
as the cross entropy is not: ``attention_costs`` gives the three terms for ``plan``.
Decoding caches one indexer key per token in a layer that runs an indexer, beside MLA's latent and rotary key
(the MTP layer that drafts runs its own: ``mtp_kv_cache_elements_per_token``).
"""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.models import sizes
from megatron_mtp.models.dsa.hf_mapping import INDEXER, TABLE
from megatron_mtp.models.mla.sizes import attention_score_width as mla_score_width
from megatron_mtp.models.mla.sizes import attention_shape as mla_shape
from megatron_mtp.models.sizes import LayerSizes


def attention_shape(m):
    """MLA's widths with the indexer's (a layer that runs one; ``layer_attention_shape`` for the others)."""
    import dataclasses

    return dataclasses.replace(mla_shape(m), index_heads=m.index_n_heads, index_dim=m.index_head_dim,
                               index_topk=m.index_topk, index_trains=m.indexer_loss_coeff > 0)


def layer_attention_shape(m, layer: Optional[int]):
    """Decoder layer ``layer``'s widths (None: an MTP layer, which runs its own indexer at depth 0): no
    indexer where the layer reuses an earlier top-k."""
    import dataclasses

    shape = attention_shape(m)
    return shape if layer is None or m.runs_indexer(layer + 1) else dataclasses.replace(shape, index_heads=0)


def indexer_parameters(m) -> int:
    """One indexer's parameters (its projections and its key norm)."""
    return sum(r.numel(m) for r in INDEXER)


def _mtp_indexers(cfg: Config, depths: int) -> int:
    return sum(cfg.model.runs_indexer(d + 1) for d in range(depths))


def layer_sizes(cfg: Config) -> LayerSizes:
    """One layer's blocks, its attention with its own indexer."""
    return sizes.layer_sizes(cfg, TABLE)


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    """models/sizes.py's counts less the indexers of the layers that reuse an earlier top-k."""
    m = cfg.model
    counts = sizes.parameter_counts(cfg, padded_vocab, TABLE)
    shared = (m.num_layers - m.indexer_layers()) * indexer_parameters(m)
    mtp_shared = (cfg.mtp.modules - _mtp_indexers(cfg, cfg.mtp.modules)) * indexer_parameters(m)
    return {**counts, "main": counts["main"] - shared, "main_active": counts["main_active"] - shared,
            "mtp_unique": counts["mtp_unique"] - mtp_shared}


def sparse_keys(seq: int, topk: int) -> float:
    """Earlier tokens (itself included) a query reads, averaged over the positions of a causal sequence of
    ``seq`` tokens when each reads at most ``topk``: seq/2 up to topk = seq, then topk − topk²/(2·seq)."""
    return seq / 2 if seq <= topk else topk - topk * topk / (2 * seq)


def indexer_flops(m, seq: int) -> float:
    """The indexer's scores of one token, forward: every head with every earlier token, then their weighted sum."""
    return 2 * m.index_n_heads * (m.index_head_dim + 1) * seq / 2


def sparse_mla_flops(m, seq: int) -> float:
    """Absorbed MLA over the top-k of one token, forward: scores over the latent and rotary key, values in the
    latent."""
    return 2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_pos_emb_head_dim) * sparse_keys(seq, m.index_topk)


def dense_mla_flops(cfg: Config, seq: int) -> float:
    """Dense MLA's scores and values of one token, forward, over every earlier token (no absorption)."""
    return 2 * mla_score_width(cfg) * seq / 2


def attention_costs(cfg: Config) -> dict:
    """Training FLOPs (3 × forward) per token of the main model's attention scores, summed over its decoder
    layers, at training.seq_length: the indexers', the top-k MLA's, and dense MLA's for the same model."""
    m, seq = cfg.model, cfg.training.seq_length
    return {"seq_length": seq, "index_topk": m.index_topk, "layers": m.num_layers,
            "indexer_layers": m.indexer_layers(),
            "indexer_flops_per_token": 3.0 * m.indexer_layers() * indexer_flops(m, seq),
            "sparse_mla_flops_per_token": 3.0 * m.num_layers * sparse_mla_flops(m, seq),
            "dense_mla_flops_per_token": 3.0 * m.num_layers * dense_mla_flops(cfg, seq)}


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """The weights' FLOPs (models/sizes.py; the shared layers' indexers taken off) and each layer's indexer and
    top-k MLA (module note)."""
    m, seq = cfg.model, cfg.training.seq_length
    base = sizes.training_flops_per_token(cfg, padded_vocab, mtp_layers, TABLE, 0)
    layers = m.num_layers + mtp_layers
    indexers = m.indexer_layers() + _mtp_indexers(cfg, mtp_layers)
    forward = layers * sparse_mla_flops(m, seq) + indexers * indexer_flops(m, seq)
    return base + 3.0 * (forward - 2 * (layers - indexers) * indexer_parameters(m))


def kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> float:
    """What a decoder layer caches per token (the decoder's ``cache_dims``), averaged over the layers, unrounded so
    that times the layers it is their sum: MLA's latent and rotary key in every layer, the indexer's key
    (index_head_dim) in a layer that runs its own indexer (IndexShare's shared layers keep none)."""
    m = cfg.model
    return m.kv_lora_rank + m.qk_pos_emb_head_dim + m.index_head_dim * m.indexer_layers() / m.num_layers


def mtp_kv_cache_elements_per_token(cfg: Config, context: Optional[int] = None) -> int:
    """What the drafting MTP layer (depth 0) caches per token: MLA's latent and rotary key, and its own indexer's key
    where megatron-core gives it one (its layer number 1 under IndexShare's rule; the decoder refuses one without)."""
    m = cfg.model
    return m.kv_lora_rank + m.qk_pos_emb_head_dim + (m.index_head_dim if m.runs_indexer(1) else 0)


def mla_head_size(cfg: Config) -> int:
    """MLA's cached width per token (its latent and rotary key), what vLLM's MLA kernels take."""
    return cfg.model.kv_lora_rank + cfg.model.qk_pos_emb_head_dim


def index_head_dim(cfg: Config) -> int:
    """The width of an indexer head: the one size vLLM's and SGLang's indexer kernels take (convert/serving.py)."""
    return cfg.model.index_head_dim


def decode_attention_flops(cfg: Config, context: int) -> float:
    """The indexer over every cached token where a layer runs one, and MLA over the top-k it picks (averaged
    over the layers)."""
    m = cfg.model
    read = min(context, m.index_topk)
    share = m.indexer_layers() / m.num_layers
    return share * 2 * m.index_n_heads * m.index_head_dim * context + \
        2 * m.num_attention_heads * (2 * m.kv_lora_rank + m.qk_pos_emb_head_dim) * read
