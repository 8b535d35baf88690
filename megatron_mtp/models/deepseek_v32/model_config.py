"""DeepSeek-V3.2's own model fields: the DSA families' (models/dsa/model_config.py: MLA, YaRN, the lightning
indexer in every layer) under DeepSeek-V3.2's name and RoPE (``model.family=deepseek_v32`` builds this class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from megatron_mtp.models.dsa.model_config import DSAModelConfig, check  # noqa: F401  (the family interface)


@dataclass
class DeepseekV32ModelConfig(DSAModelConfig):
    TITLE: ClassVar[str] = "DeepSeek-V3.2"
    INDEXER_ROPE_INTERLEAVED: ClassVar[bool] = False  # transformers' DeepseekV32Indexer rotates halves
    GROWS_FROM: ClassVar[tuple[str, ...]] = ("deepseek_v3",)  # the report's start: a V3 checkpoint
