"""Our model config <-> Hugging Face GLM-5 config (``GlmMoeDsaHFConfig``, transformers' GlmMoeDsaForCausalLM),
both ways: the DSA families' conversion (models/dsa/hf_config.py: DeepSeek-V3's, and the indexer's fields),
IndexShare and transformers' GLM-5 defaults for what a file leaves out (hf_config_json.py). An export writes
``indexer_types`` (what transformers reads first) beside the frequency and offset that give it."""

from __future__ import annotations

from typing import Any, Mapping, Optional

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.models.dsa import hf_config as dsa
from megatron_mtp.models.glm_moe_dsa.hf_config_json import SHARE_KEYS, GlmMoeDsaHFConfig, parse_hf_config, with_defaults
from megatron_mtp.models.glm_moe_dsa.model_config import GlmMoeDsaModelConfig
from megatron_mtp.models.hf_common import carry_source_fields as _carry

ARCHITECTURE = "GlmMoeDsaForCausalLM"

NOT_CARRIED = {
    **dsa.NOT_CARRIED,
    "architectures": f"exports are {ARCHITECTURE}",
    "model_type": "exports are glm_moe_dsa",
    "index_topk_pattern": "exports write indexer_types, which transformers reads first",
}


def to_hf_config(model: GlmMoeDsaModelConfig, mtp: MTPConfig, **kwargs) -> GlmMoeDsaHFConfig:
    """The HF config of a model with this architecture (keywords as DeepSeek-V3's ``to_hf_config``)."""
    own = dict(indexer_types=tuple(model.indexer_types()), index_topk_freq=model.index_topk_freq,
               index_skip_topk_offset=model.index_skip_topk_offset)
    return dsa.to_hf_config(model, mtp, GlmMoeDsaHFConfig, ARCHITECTURE, own, **kwargs)


def from_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> tuple[GlmMoeDsaModelConfig, MTPConfig, int]:
    """(model section, mtp section, vocab size) for an HF GLM-5 config.json dict."""
    view = parse_hf_config(raw, where)  # the indexer's fields, IndexShare and transformers' layer lists, checked
    model, mtp_cfg, vocab = dsa.from_hf_config(with_defaults(raw), where, view, GlmMoeDsaModelConfig, ARCHITECTURE,
                                               SHARE_KEYS)
    model.family = "glm_moe_dsa"
    model.index_topk_freq, model.index_skip_topk_offset = view.index_topk_freq, view.index_skip_topk_offset
    return model, mtp_cfg, vocab


def carry_source_fields(written: Mapping[str, Any], source: Optional[Mapping[str, Any]],
                        tokenizer_ids: Mapping[str, Optional[int]]) -> dict[str, Any]:
    """``written`` with what still holds of ``source`` (models/hf_common.py), read as GLM-5."""
    return _carry(written, source, tokenizer_ids, from_hf_config, NOT_CARRIED)
