"""GLM-4.5's own model fields: grouped-query attention (models/gqa/) with partial RoPE and an optional qkv
bias (``model.family=glm4_moe`` builds this class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron_mtp.models.gqa.model_config import GroupedQueryModelConfig


@dataclass
class Glm4MoeModelConfig(GroupedQueryModelConfig):
    rotary_percent: Optional[float] = None
    """Share of each head's dimensions that RoPE rotates: the first head_dim x this, rotate-half
    style (HF partial_rotary_factor). null: 0.5, GLM-4.5's."""
    add_qkv_bias: bool = False
    """A bias on the query, key and value projections, never on the output one (HF attention_bias)."""
