"""Which decoder layers have a routed MLP: the one rule every family, run config and config.json view
reads (a ModelConfig's ``moe_layer_rule()``, a family's HF view's ``moe_layers``).

DeepSeek-V3, DeepSeek-V3.2 and GLM-4.5 spell it ``first_k_dense_replace`` (and DeepSeek ``moe_layer_freq``:
MoE where ``index % freq == 0``); Qwen3-MoE spells it ``decoder_sparse_step`` (MoE where
``(index + 1) % step == 0``) and ``mlp_only_layers`` (dense whatever the step); Gemma 4 has its MoE block in
every layer or none. One dataclass holds all three, so "is layer i MoE" is answered in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class MoeLayers:
    num_layers: int
    num_experts: int
    """Routed experts (0: a dense model)."""
    first_dense: int = 0
    """The first k layers are dense (DeepSeek's first_k_dense_replace)."""
    every: int = 1
    """MoE on every ``every``-th layer: where ``index % every == phase``."""
    phase: int = 0
    """DeepSeek's moe_layer_freq counts from layer 0 (phase 0); Qwen3's decoder_sparse_step from layer
    ``step - 1`` (phase ``step - 1``)."""
    dense: frozenset[int] = frozenset()
    """Layers that are dense whatever the rule above says (Qwen3's mlp_only_layers)."""
    mtp_index: Optional[int] = None
    """The layer index at which the serving engines build the family's MTP layer, whose rule the MTP layers
    and parallel heads follow in training too, so that what trains is what exports: DeepSeek-V3 and
    GLM-4.5 build MTP module d as HF layer num_layers + d (the first: num_layers); SGLang's Qwen3-MoE draft
    builds its one layer as layer 0. None: num_layers."""

    def __contains__(self, index: int) -> bool:
        return (self.num_experts > 0 and index >= self.first_dense and index % self.every == self.phase
                and index not in self.dense)

    @property
    def count(self) -> int:
        """How many decoder layers are MoE."""
        return sum(i in self for i in range(self.num_layers))

    @property
    def mtp(self) -> bool:
        """The MTP layers and parallel heads have a routed MLP: the rule at ``mtp_index``."""
        return (self.num_layers if self.mtp_index is None else self.mtp_index) in self
