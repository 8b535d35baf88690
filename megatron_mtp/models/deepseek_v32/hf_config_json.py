"""Typed view of a Hugging Face DeepSeek-V3.2 ``config.json``: the DSA families' view (models/dsa/hf_view.py:
DeepSeek-V3's fields, the indexer's three, transformers' per-layer lists checked) as DeepSeek-V3.2 names it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from megatron_mtp.models.dsa.hf_view import INDEX_KEYS, READ_KEYS, DSAHFConfig, parse_dsa_config  # noqa: F401


@dataclass(frozen=True, kw_only=True)
class DeepseekV32HFConfig(DSAHFConfig):
    """DeepSeek-V3's fields and the lightning indexer's (transformers' defaults)."""

    model_type: str = "deepseek_v32"


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> DeepseekV32HFConfig:
    """The view of a DeepSeek-V3.2 config.json dict; a malformed or contradicting field is a UserError."""
    return parse_dsa_config(raw, where, DeepseekV32HFConfig)
