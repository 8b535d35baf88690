"""DeepSeek-V3's own model fields: multi-head latent attention and YaRN (models/mla/model_fields.py, over
config.model.ModelConfig's shared ones; ``model.family=deepseek_v3`` builds this class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from megatron_mtp.models.mla.model_fields import MLAModelConfig, YarnConfig, check  # noqa: F401  (the family interface)


@dataclass
class DeepseekV3ModelConfig(MLAModelConfig):
    MTP_STYLES: ClassVar[tuple[str, ...]] = ("sequential", "parallel")
    RECOMPUTE_MODULES: ClassVar[tuple[str, ...]] = ("mla_up_proj",)

    def check(self, cfg: Any) -> None:
        check(cfg)
