"""An EAGLE-3 drafter in ``convert``: its format is speculators' (hf.py), written by export.py beside a target that
``to-hf --mtp none`` exports; ``to-hf`` and ``from-hf --mtp-dir`` do not write or read it themselves yet (each says
so in one sentence)."""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.tensor_table import Param
from megatron_mtp.mtp_styles.eagle3.hf import MODEL_TYPE
from megatron_mtp.mtp_styles.eagle3.shape import BUFFERS, tensor_shapes

_EXPORT = ("export the target with --mtp none and the drafter with `python -m megatron_mtp.mtp_styles.eagle3.export "
           "CHECKPOINT OUT --verifier TARGET_DIR`")


def claims(config: dict[str, Any]) -> bool:
    return config.get("speculators_model_type") == MODEL_TYPE


def import_depth(main, mtp, with_mtp: bool) -> int:
    """An EAGLE-3 drafter is not imported yet (one sentence); without --mtp-dir's drafter, none."""
    if with_mtp:
        import_shape(None, mtp, None, 0)
    return 0


def drafter_params(cfg, vocab: int) -> list:
    """The drafter's tensors in the converter's table with no Hugging Face name: to-hf claims and checks them and
    writes the target alone (the speculators directory is export.py's)."""
    if not cfg.mtp.num_layers:
        return []
    return [Param(key, (), "mtp", integer=key in BUFFERS) for key in tensor_shapes(cfg, vocab)]


def drafter_shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    return tensor_shapes(cfg, vocab) if cfg.mtp.num_layers else {}


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    raise UserError(f"{mtp_dir.path}: from-hf --mtp-dir does not import a speculators EAGLE-3 drafter yet; import "
                    "the target alone (its drafter reads as megatron_mtp/mtp_styles/eagle3/hf.py from_speculators)")


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family, target=None,
               speculative: Optional[int] = None) -> dict:
    raise UserError(f"convert to-hf does not write an EAGLE-3 drafter; {_EXPORT}")


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    if mtp not in (None, "none"):
        raise UserError(f"--mtp {mtp}: convert to-hf does not write an EAGLE-3 drafter (mtp.style eagle3); {_EXPORT}")
    return "none"


def serving_flags() -> dict:
    return {}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {}
