"""A separate drafter in Hugging Face form: a model directory of its own in mtp/ (convert/assistant_dir.py; Gemma 4's
``gemma4_assistant``), its generation_config.json saying how many tokens it drafts; the target's config.json says
no MTP layer."""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.convert import assistant_dir
from megatron_mtp.convert.hf_source import GENERATION_CONFIG


def claims(config: dict[str, Any]) -> bool:
    return assistant_dir.is_assistant_config(config)


def drafter_params(cfg, vocab: int) -> list:
    return assistant_dir.assistant_params(cfg, vocab)


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Its shape from its config.json; it trains on the frozen target (mtp.freeze_base)."""
    where = str(mtp_dir.path / "config.json")
    mtp_cfg.assistant, mtp_cfg.freeze_base = assistant_dir.shape_from_hf(mtp_dir.config, model_cfg, vocab, where), True


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family) -> dict:
    torch_dtype = "float32" if dtype == "fp32" else "bfloat16"
    return assistant_dir.configs(cfg, vocab, torch_dtype, None)[0]


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    return assistant_dir.check_layout(mtp, mtp_layout, serve_for) if has_mtp else mtp


def serving_flags() -> dict:
    return {"assistant": True}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {GENERATION_CONFIG: assistant_dir.configs(cfg, vocab, "", speculative)[1]}
