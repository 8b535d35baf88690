"""Sequential MTP modules in Hugging Face form: the release's own MTP layers (``model.layers.N`` after the decoder's,
``num_nextn_predict_layers``), inline or in mtp/ (whole, or SGLang's one-layer NextN form)."""

from __future__ import annotations

from typing import Any, Optional


def claims(config: dict[str, Any]) -> bool:
    """Whether an MTP directory's config.json is this style's: the default, when no other style claims it."""
    return False


def drafter_params(cfg, vocab: int) -> list:
    """None beside the family's table: its rows are the family's (tensor_rows)."""
    return []


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Nothing beyond mtp.num_layers."""


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family) -> dict:
    """config.json of mtp/: the whole model's (an engine loads the MTP layers from it), or SGLang's NextN form."""
    if mtp_layout == "nextn":
        return dict(full, architectures=[family.architecture + "NextN"], num_hidden_layers=depth)
    return full


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    """Every --mtp and --mtp-layout applies."""
    return mtp


def serving_flags() -> dict:
    """convert/serving.py Export fields this style sets."""
    return {}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    """file name -> JSON the mtp/ directory holds beside config.json."""
    return {}
