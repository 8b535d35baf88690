"""Our model config <-> Hugging Face DeepSeek-V3.2 config (``DeepseekV32HFConfig``), both ways: the DSA
families' conversion (models/dsa/hf_config.py: DeepSeek-V3's, and the indexer's fields)."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.models.deepseek_v32.hf_config_json import DeepseekV32HFConfig, parse_hf_config
from megatron_mtp.models.deepseek_v32.model_config import DeepseekV32ModelConfig
from megatron_mtp.models.dsa import hf_config as dsa
from megatron_mtp.models.hf_common import carry_source_fields as _carry

ARCHITECTURE = "DeepseekV32ForCausalLM"

NOT_CARRIED = {
    **dsa.NOT_CARRIED,
    "architectures": f"exports are {ARCHITECTURE}",
    "model_type": "exports are deepseek_v32",
}


def to_hf_config(model: DeepseekV32ModelConfig, mtp: MTPConfig, **kwargs) -> DeepseekV32HFConfig:
    """The HF config of a model with this architecture (keywords as DeepSeek-V3's ``to_hf_config``)."""
    return dsa.to_hf_config(model, mtp, DeepseekV32HFConfig, ARCHITECTURE, {}, **kwargs)


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[DeepseekV32ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF DeepSeek-V3.2 config.json dict."""
    view = parse_hf_config(raw, where)  # the indexer's fields and transformers' layer lists, checked
    model, mtp_cfg, vocab = dsa.from_hf_config(raw, where, view, DeepseekV32ModelConfig, ARCHITECTURE)
    model.family = "deepseek_v32"
    return model, mtp_cfg, vocab


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as DeepSeek-V3.2."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
