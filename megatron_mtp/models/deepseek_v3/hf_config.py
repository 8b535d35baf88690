"""Our model config <-> Hugging Face DeepSeek-V3 config, both ways: the MLA families' shared conversion
(models/mla/hf_config.py) with DeepSeek-V3's model config class."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig
from megatron_mtp.models.hf_common import carry_source_fields as _carry
from megatron_mtp.models.mla.hf_config import NOT_CARRIED, to_hf_config  # noqa: F401  (the family interface)
from megatron_mtp.models.mla.hf_config import from_hf_config as _from_hf_config


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[DeepseekV3ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF DeepSeek-V3/V2 config.json dict."""
    return _from_hf_config(raw, where, DeepseekV3ModelConfig)


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as DeepSeek-V3."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
