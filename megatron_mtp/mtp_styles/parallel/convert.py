"""Parallel MTP heads in Hugging Face form: no engine's, so a mtp/ directory of their own (models/parallel_heads_hf.py)
beside the main model; --mtp none and separate only (convert/heads_layout.py refuses the rest)."""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.parallel_heads_hf import heads_config, is_heads_config


def claims(config: dict[str, Any]) -> bool:
    return is_heads_config(config)


def drafter_params(cfg, vocab: int) -> list:
    return []


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Nothing beyond mtp.num_layers."""


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family) -> dict:
    return heads_config(dict(full, num_nextn_predict_layers=0), depth)


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    if has_mtp and mtp not in ("none", "only"):
        from megatron_mtp.convert.heads_layout import refuse_layout

        refuse_layout(serve_for, mtp or "separate", mtp_layout or "hf")
    if mtp == "only":
        raise UserError("--mtp only writes the Hugging Face directory of sequential MTP modules, and this "
                        "checkpoint has parallel MTP heads; export with --mtp separate (OUT/mtp holds the heads)")
    return mtp


def serving_flags() -> dict:
    return {"parallel_heads": True}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {}
