"""The model fields of multi-head latent attention and YaRN (over config.model.ModelConfig's shared ones),
which the MLA families (DeepSeek-V3, DeepSeek-V3.2) share, and their checks."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.errors import UserError


@dataclass
class YarnConfig:
    factor: float = 1.0
    """RoPE scaling factor (1.0 disables YaRN: plain RoPE)."""
    original_max_position_embeddings: int = 4096
    """Context length the rotary frequencies were designed for before YaRN stretching."""
    beta_fast: float = 32.0
    """YaRN high-frequency boundary (in rotations)."""
    beta_slow: float = 1.0
    """YaRN low-frequency boundary (in rotations)."""
    mscale: float = 1.0
    """YaRN attention-magnitude scale coefficient."""
    mscale_all_dim: float = 1.0
    """YaRN magnitude coefficient applied to all dimensions (DeepSeek-V3 uses 1.0)."""


@dataclass
class MLAModelConfig(ModelConfig):
    """MLA's fields; a family's class adds its own and its ``MTP_STYLES``/``RECOMPUTE_MODULES``."""

    q_lora_rank: Optional[int] = 64
    """Rank of the query down-projection (null: full-rank queries, as in DeepSeek-V2-Lite)."""
    kv_lora_rank: int = 32
    """Rank of the compressed key/value latent."""
    qk_head_dim: int = 32
    """Per-head query/key dimension without the rotary part (HF qk_nope_head_dim)."""
    qk_pos_emb_head_dim: int = 16
    """Per-head decoupled rotary dimension (HF qk_rope_head_dim)."""
    v_head_dim: int = 32
    """Per-head value dimension."""
    yarn: YarnConfig = field(default_factory=YarnConfig)
    """YaRN context-extension parameters."""

    def check(self, cfg: Any) -> None:
        check(cfg)


def check(cfg) -> None:
    """One sentence for the first MLA field the model cannot take."""
    m = cfg.model
    if m.q_lora_rank is not None and m.q_lora_rank <= 0:
        raise UserError("model.q_lora_rank must be positive or null")
    for name in ("kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim"):
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} is {getattr(m, name)}; it must be positive")
