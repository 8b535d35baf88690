"""Parallel MTP heads in Hugging Face form: no engine's, so a mtp/ directory of their own (hf_format.py) beside the
main model; --mtp none and separate only (layouts.py refuses the rest)."""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.convert.serving import DraftServing
from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import mtp_depth
from megatron_mtp.mtp_styles.parallel.hf_format import heads_config, is_heads_config, read_heads_config
from megatron_mtp.mtp_styles.parallel.layouts import refuse_layout, unserved_sentence


def claims(config: dict[str, Any]) -> bool:
    return is_heads_config(config)


def import_depth(main, mtp, with_mtp: bool) -> int:
    """Its config.json's number of heads (the main config.json's own MTP depth is read, and checked, all the same)."""
    mtp_depth(main.config, str(main.path / "config.json"))
    return read_heads_config(mtp.config, str(mtp.path / "config.json"), main.config).num_heads if with_mtp else 0


def drafter_params(cfg, vocab: int) -> list:
    return []


def drafter_shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    return {}


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Nothing beyond mtp.num_layers."""


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family, target=None,
               speculative: Optional[int] = None) -> dict:
    return heads_config(dict(full, num_nextn_predict_layers=0), depth)


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    if has_mtp and mtp not in ("none", "only"):
        refuse_layout(serve_for, mtp or "separate", mtp_layout or "hf")
    if mtp == "only":
        raise UserError("--mtp only writes the Hugging Face directory of sequential MTP modules, and this "
                        "checkpoint has parallel MTP heads; export with --mtp separate (OUT/mtp holds the heads)")
    return mtp


def _words(e) -> str:
    return (f"{e.depth} parallel MTP head" + ("s" if e.depth > 1 else "") + " in mtp/ (no engine below loads "
            f"them; `megatron-mtp generate {e.out} --speculative K` drafts K <= {e.depth} tokens with them)")


def serving_flags() -> dict:
    """No engine drafts with the heads."""
    return {"draft": DraftServing(kind="parallel-heads", words=_words, unserved=unserved_sentence)}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {}
