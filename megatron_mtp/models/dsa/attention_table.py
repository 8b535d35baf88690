"""THE tensor table of the DSA families: MLA's rules (models/mla/attention_table.py) with the latent norms
under one name in both specs (DSA never fuses them), and the lightning indexer's five tensors under
megatron-core's ``self_attention.core_attention.indexer.`` (transformers: ``self_attn.indexer.``), whole on
every tensor-parallel rank, in each layer that runs its own indexer (``runs_indexer``: every layer, the MTP
layers too, but where GLM-5's IndexShare reuses an earlier layer's top-k: that layer has none)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.models.mla.attention_table import MLA_RULES
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
_ATTENTION = tuple(r if r.spec is None else Rule(r.mcore, r.hf, r.shape, r.split, r.role) for r in _MLA) + INDEXER
_LAYER = re.compile(r"(?:decoder\.layers\.(\d+)|mtp\.layers\.(\d+)\.(?:transformer_layer|mtp_model_layer))\.")


def _attention(model: ModelConfig, spec: Optional[Spec]) -> list[Rule]:
    """A DSA layer's tensors with its own indexer (a low-rank query always: the indexer reads its latent)."""
    return list(_ATTENTION)


def layer_number(prefix: str) -> int:
    """megatron-core's 1-based number of the layer at ``prefix`` (models/dsa/model_fields.py): decoder layer i
    is i + 1, MTP depth d is d + 1."""
    match = _LAYER.match(prefix)
    if match is None:
        raise KeyError(prefix)
    return int(match.group(1) if match.group(1) is not None else match.group(2)) + 1


@dataclass(frozen=True)
class DSATable(Table):
    """The table whose layers have an indexer where they run their own (module note)."""

    def rules_at(self, model: ModelConfig, prefix: str, moe: bool, spec: Optional[Spec]) -> list[Rule]:
        rules = self.layer_rules(model, moe, spec)
        return rules if model.runs_indexer(layer_number(prefix)) else [r for r in rules if r not in INDEXER]


TABLE = DSATable(attention=_ATTENTION, attention_for=_attention)

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
