"""Our model config <-> Hugging Face DeepSeek-V3.2 config (``DeepseekV32HFConfig``), both ways: DeepSeek-V3's
conversion (models/mla/hf_config.py: MLA, routing, YaRN, its refusals) and the indexer's fields.
transformers writes ``mlp_layer_types``/``layer_types`` too; the view checks them and an export leaves
them to transformers' defaults, which give the same lists."""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.models.deepseek_v32.hf_view import INDEX_KEYS, DeepseekV32HFConfig, parse_hf_config
from megatron_mtp.models.deepseek_v32.model_config import DeepseekV32ModelConfig
from megatron_mtp.models.hf_common import carry_source_fields as _carry
from megatron_mtp.models.mla import hf_config as v3

ARCHITECTURE = "DeepseekV32ForCausalLM"

NOT_CARRIED = {
    **v3.NOT_CARRIED,
    "architectures": f"exports are {ARCHITECTURE}",
    "model_type": "exports are deepseek_v32",
    "mlp_layer_types": "transformers derives it from first_k_dense_replace",
    "layer_types": "transformers derives it (indexed attention in every layer)",
}


def to_hf_config(model: DeepseekV32ModelConfig, mtp: MTPConfig, **kwargs) -> DeepseekV32HFConfig:
    """The HF config of a model with this architecture (keywords as DeepSeek-V3's ``to_hf_config``)."""
    base = v3.to_hf_config(model, mtp, **kwargs)
    fields = {f.name: getattr(base, f.name) for f in dataclasses.fields(base)}
    fields.update(architectures=(ARCHITECTURE,), model_type="deepseek_v32")
    return DeepseekV32HFConfig(**fields, **{k: getattr(model, k) for k in INDEX_KEYS})


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[DeepseekV32ModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF DeepSeek-V3.2 config.json dict."""
    view = parse_hf_config(raw, where)  # the indexer's fields and transformers' layer lists, checked
    archs = list(view.architectures)
    if archs and ARCHITECTURE not in archs:
        from megatron_mtp.errors import UserError

        raise UserError(f"{where}: architectures {archs} is not {ARCHITECTURE}")
    # the rest reads as DeepSeek-V3 (its refusals, its unknown-field check)
    plain = {k: v for k, v in raw.items() if k not in (*INDEX_KEYS, "mlp_layer_types", "layer_types", "mlp_bias")}
    plain.update(model_type="deepseek_v3", architectures=["DeepseekV3ForCausalLM"])
    model, mtp_cfg, vocab = v3.from_hf_config(plain, where, DeepseekV32ModelConfig)
    model.family = "deepseek_v32"
    for key in INDEX_KEYS:
        setattr(model, key, getattr(view, key))
    return model, mtp_cfg, vocab


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as DeepSeek-V3.2."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
