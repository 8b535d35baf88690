"""The grouped-query attention's model fields (over config.model.ModelConfig's shared ones) and their
checks; a GQA family's model config derives from ``GroupedQueryModelConfig`` and adds its own fields
(GLM-4.5: partial RoPE and the qkv bias as fields; Qwen3-MoE: both fixed as class constants)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.errors import UserError


@dataclass
class GroupedQueryModelConfig(ModelConfig):
    num_query_groups: Optional[int] = None
    """Key/value heads (HF num_key_value_heads); each serves num_attention_heads / num_query_groups
    query heads. null: as many as attention heads."""
    head_dim: Optional[int] = None
    """Width of each query/key/value head (HF head_dim). null: hidden_size / num_attention_heads."""
    qk_layernorm: bool = False
    """An RMSNorm of width head_dim on each query and key head before RoPE (HF use_qk_norm)."""
    # each family adds rotary_percent (Optional[float]) and add_qkv_bias (bool), as fields or class constants

    def check(self, cfg: Any) -> None:
        check(cfg)


def head_dim(m: GroupedQueryModelConfig) -> int:
    """Grouped-query attention's head width: model.head_dim, else hidden_size / num_attention_heads."""
    return m.head_dim or m.hidden_size // m.num_attention_heads


def query_groups(m: GroupedQueryModelConfig) -> int:
    """Key/value groups: model.num_query_groups, else one per query head."""
    return m.num_query_groups or m.num_attention_heads


def rotary_percent(m: GroupedQueryModelConfig) -> float:
    """The share of each head RoPE rotates: model.rotary_percent, else GLM-4.5's 0.5."""
    return 0.5 if m.rotary_percent is None else m.rotary_percent


def check(cfg) -> None:
    """One sentence for the first grouped-query field that the model or the layout cannot take."""
    m, tp = cfg.model, cfg.parallel.tensor
    for name, null in (("num_query_groups", "one key/value head per query head"),
                       ("head_dim", "model.hidden_size / model.num_attention_heads")):
        value = getattr(m, name)
        if value is not None and value < 1:
            raise UserError(f"model.{name} is {value}; set a positive number, or null for {null}")
    groups = query_groups(m)
    if groups < 1 or m.num_attention_heads % groups:
        raise UserError(f"model.num_query_groups={m.num_query_groups} must be positive and divide "
                        f"model.num_attention_heads={m.num_attention_heads}")
    if groups % tp:
        raise UserError(f"model.num_query_groups={groups} is not divisible by parallel.tensor={tp}; every "
                        "tensor-parallel rank must hold whole key/value groups")
    width = head_dim(m)
    if width < 1 or (m.head_dim is None and m.hidden_size % m.num_attention_heads):
        raise UserError(f"model.head_dim is null and model.hidden_size={m.hidden_size} is not divisible by "
                        f"model.num_attention_heads={m.num_attention_heads}; set model.head_dim")
    share = rotary_percent(m)
    rotated = width * share
    if not 0.0 < share <= 1.0 or rotated != int(rotated) or int(rotated) % 2:
        raise UserError(f"model.rotary_percent={m.rotary_percent} must be in (0, 1] and rotate an even number "
                        f"of the head's {width} dimensions")
