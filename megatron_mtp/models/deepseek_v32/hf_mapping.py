"""THE tensor table of DeepSeek-V3.2: MLA's rules (models/mla/hf_mapping.py) with
the latent norms under one name in both specs (DSA never fuses them), and the lightning indexer's
five tensors under megatron-core's ``self_attention.core_attention.indexer.`` (transformers:
``self_attn.indexer.``), whole on every tensor-parallel rank. Every layer has an indexer, the MTP
layer too (the release's layer 61), so the MTP rules need nothing of their own."""

from __future__ import annotations

import dataclasses
from typing import Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.models.mla.hf_mapping import MLA_RULES
from megatron_mtp.models.tensor_table import Rule, Spec, Table

_INDEXER = "self_attention.core_attention.indexer."

INDEXER = (
    Rule(_INDEXER + "linear_wq_b.weight", ("self_attn.indexer.wq_b.weight",),
         lambda m: (m.index_n_heads * m.index_head_dim, m.q_lora_rank), "none"),
    Rule(_INDEXER + "linear_wk.weight", ("self_attn.indexer.wk.weight",),
         lambda m: (m.index_head_dim, m.hidden_size), "none"),
    Rule(_INDEXER + "k_norm.weight", ("self_attn.indexer.k_norm.weight",),
         lambda m: (m.index_head_dim,), "none", "norm"),
    Rule(_INDEXER + "k_norm.bias", ("self_attn.indexer.k_norm.bias",),
         lambda m: (m.index_head_dim,), "none", "norm"),
    Rule(_INDEXER + "linear_weights_proj.weight", ("self_attn.indexer.weights_proj.weight",),
         lambda m: (m.index_n_heads, m.hidden_size), "none"),
)

_MLA = tuple(r for r in MLA_RULES if r.spec != "te" and not r.mcore.startswith("self_attention.linear_q_proj"))
_ATTENTION = tuple(r if r.spec is None else dataclasses.replace(r, spec=None) for r in _MLA) + INDEXER


def _attention(model: ModelConfig, spec: Optional[Spec]) -> list[Rule]:
    """Every DSA layer's tensors (a low-rank query always: the indexer reads its latent)."""
    return list(_ATTENTION)


TABLE = Table(attention=_ATTENTION, attention_for=_attention)

_ORDER = ("input_layernorm.weight",  # the core attention, with its indexer, is built first
          _INDEXER + "linear_wq_b.weight", _INDEXER + "linear_wk.weight", _INDEXER + "k_norm.weight",
          _INDEXER + "k_norm.bias", _INDEXER + "linear_weights_proj.weight",
          "self_attention.linear_proj.weight", "self_attention.linear_q_down_proj.weight",
          "self_attention.linear_q_up_proj.weight", "self_attention.linear_kv_down_proj.weight",
          "self_attention.linear_kv_up_proj.weight", "self_attention.q_layernorm.weight",
          "self_attention.kv_layernorm.weight")
ATTENTION_ORDER = {True: _ORDER, False: _ORDER}
"""The order megatron-core registers a DSA attention block's parameters in (same in both specs; checked
against the built model by tests/dist/test_built_model.py)."""
