"""Sequential MTP modules in Hugging Face form: the release's own MTP layers (``model.layers.N`` after the decoder's,
``num_nextn_predict_layers``), inline or in mtp/ (whole, or SGLang's one-layer NextN form)."""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.convert.serving import DraftServing
from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import mtp_depth


def claims(config: dict[str, Any]) -> bool:
    """Whether an MTP directory's config.json is this style's: the default, when no other style claims it."""
    return False


def import_depth(main, mtp, with_mtp: bool) -> int:
    """The depth ``from-hf`` imports from the HF directory ``main`` and the MTP directory ``mtp`` of this format
    (None: the MTP layers, if any, are in ``main``); 0 without MTP (``--no-mtp``)."""
    declared = mtp_depth(main.config, str(main.path / "config.json"))
    if mtp is not None:
        declared = mtp_depth(mtp.config, str(mtp.path / "config.json"))
        if declared == 0:
            raise UserError(f"MTP directory '{mtp.path}' has num_nextn_predict_layers 0; it holds no MTP layers")
    return declared if with_mtp else 0


def drafter_params(cfg, vocab: int) -> list:
    """None beside the family's table: its rows are the family's (tensor_rows)."""
    return []


def drafter_shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    """megatron-core key -> global shape of a separate drafter's own tensors (the shape checks', convert/shapes.py)."""
    return {}


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Nothing beyond mtp.num_layers."""


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family, target=None,
               speculative: Optional[int] = None) -> dict:
    """config.json of mtp/: the whole model's (an engine loads the MTP layers from it), or SGLang's NextN form."""
    if mtp_layout == "nextn":
        nextn = family.serving.nextn_architecture or family.architecture + "NextN"
        return dict(full, architectures=[nextn], num_hidden_layers=depth)
    return full


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    """Every --mtp and --mtp-layout applies."""
    return mtp


def serving_flags() -> dict:
    """convert/serving.py Export fields this style sets: how the engines serve its draft (``DraftServing``; the
    default: the engines' own MTP draft, judged by their facts)."""
    return {"draft": DraftServing()}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    """file name -> JSON the mtp/ directory holds beside config.json."""
    return {}
