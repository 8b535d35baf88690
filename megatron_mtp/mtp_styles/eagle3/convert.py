"""An EAGLE-3 drafter in ``convert``: a speculators directory (hf.py) where a separate drafter's goes, both ways.

``to-hf``: the target in OUT/main (its config.json says no MTP layer), the drafter in OUT/mtp (``--mtp separate``,
the default) or in OUT alone (``--mtp only``); its config.json names OUT/main as its verifier (null with ``--mtp
only``, where no target is written). ``from-hf TARGET OUT --mtp-dir DRAFTER`` (the directory claimed by its
``speculators_model_type: eagle3``) imports it beside the target: a checkpoint that a drafter run continues from.

Its tensors go through the converters' one table as a separate drafter's rows (convert/drafter_dir.py): speculators'
names, the fused fc1 as gate and up (``GATED``), ``d2t`` int64 and ``t2d`` bool as they are (with a draft
vocabulary; over the whole vocabulary speculators has neither and the rows write nothing), and ``embed_tokens``: a
``Copy`` of the target's embedding, its first rows (the tokenizer's vocabulary, not the padded table), which the
import passes over after checking it is the target's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from megatron_mtp.convert.drafter_dir import table_name
from megatron_mtp.convert.serving import DraftServing
from megatron_mtp.errors import UserError
from megatron_mtp.models.tensor_table import EMBEDDING, Param
from megatron_mtp.models.tensor_transforms import DIRECT, GATED, Copy, Direct, Int64
from megatron_mtp.mtp_styles.eagle3 import hf
from megatron_mtp.mtp_styles.eagle3.options import Eagle3Options
from megatron_mtp.mtp_styles.eagle3.shape import PREFIX, drafter_shape, tensor_shapes

TARGET_EMBEDDING = "model.embed_tokens.weight"


@dataclass(frozen=True)
class FirstRows(Copy):
    """The target's embedding table as the drafter's ``embed_tokens``: its first ``rows`` (the padding left out)."""

    rows: int = 0

    def part_rows(self, rows: int) -> list[int]:
        return [min(self.rows, rows)]

    def to_hf(self, tensor: Any) -> list:
        return [tensor[:self.rows]]


@dataclass(frozen=True)
class Bool(Direct):
    """``t2d``, a bool table, written and read as it is."""

    def dtype(self, export: Any) -> Any:
        import torch

        return torch.bool


@dataclass(frozen=True)
class Unwritten(Direct):
    """A buffer speculators' format has no tensor for (the identity tables of a drafter over the whole
    vocabulary): claimed, not written (an import of such a drafter is refused before it is read)."""

    parts: ClassVar[int] = 0

    def part_rows(self, rows: int) -> list[int]:
        return []

    def to_hf(self, tensor: Any) -> list:
        return []


_TABLES = {"d2t": Int64(), "t2d": Bool()}
_LINEARS = ("fc.weight", "lm_head.weight")
"""The drafter's megatron-core linears whose names do not say so (the layers' ``linear_*`` do): a checkpoint
``from-hf`` writes holds their (empty) ``_extra_state`` objects, which a run loading it asks for."""


def claims(config: dict[str, Any]) -> bool:
    return hf.claims(config)


def import_depth(main, mtp, with_mtp: bool) -> int:
    """The tokens it drafts per round (its speculative_tokens: mtp.num_layers); its ``embed_tokens`` must be the
    target's embedding, which the imported drafter reads (checked here, where both directories are open)."""
    if not with_mtp:
        return 0
    depth = hf.shape_fields(mtp.config, str(mtp.path / "config.json"))["mtp.num_layers"]
    if hf.EMBEDDING in mtp and TARGET_EMBEDDING in main:
        import torch

        theirs, target = mtp.get(hf.EMBEDDING), main.get(TARGET_EMBEDDING)
        if theirs.shape[0] > target.shape[0] or not torch.equal(theirs, target[:theirs.shape[0]].to(theirs.dtype)):
            raise UserError(f"{mtp.path}: its embed_tokens.weight is not the embedding table of the target "
                            f"'{main.path}', which the drafter reads; pass the target this drafter was trained for")
    return depth


def drafter_params(cfg, vocab: int) -> list:
    """The drafter's rows (module note), in checkpoint order, then its copy of the target's embedding."""
    if not cfg.mtp.num_layers:
        return []
    shape = drafter_shape(cfg)
    names = hf.tensor_names(shape)
    rows = []
    for key in tensor_shapes(cfg, vocab):
        mine = key[len(PREFIX):]
        theirs = names.get(mine)
        if theirs is None:  # d2t/t2d over the whole vocabulary
            rows.append(Param(key, (), "mtp", transform=Unwritten()))
            continue
        transform = GATED if len(theirs) == 2 else _TABLES.get(mine, DIRECT)
        rows.append(Param(key, tuple(table_name(n) for n in theirs), "mtp", transform=transform,
                          linear=True if mine in _LINEARS else None))
    rows.append(Param(EMBEDDING, (table_name(hf.EMBEDDING),), "mtp", transform=FirstRows(rows=shape.vocab or vocab)))
    return rows


def drafter_shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    return tensor_shapes(cfg, vocab) if cfg.mtp.num_layers else {}


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """``mtp.eagle3`` from its config.json, checked against the target's; it trains on the frozen target."""
    where = str(mtp_dir.path / "config.json")
    fields = hf.shape_fields(mtp_dir.config, where)
    shape = hf.shape_of(mtp_dir.config, where)
    m = model_cfg
    if shape.hidden != m.hidden_size:
        raise UserError(f"{where}: the drafter's hidden_size is {shape.hidden} and the target's {m.hidden_size}; "
                        "pass the drafter of this target")
    if shape.vocab != vocab:
        raise UserError(f"{where}: the drafter's vocab_size is {shape.vocab} and the target's {vocab}; pass the "
                        "drafter of this target")
    if max(shape.aux_layers) > m.num_layers:
        raise UserError(f"{where}: eagle_aux_hidden_state_layer_ids {list(shape.aux_layers)} reach past the target's "
                        f"{m.num_layers} layers; pass the drafter of this target")
    if shape.eps != m.norm_epsilon or shape.rope_theta != float(m.rope_theta):
        raise UserError(f"{where}: the drafter's rms_norm_eps {shape.eps} and rope_theta {shape.rope_theta} are not "
                        f"the target's ({m.norm_epsilon}, {m.rope_theta}), which mtp.style=eagle3 builds it with")
    if not shape.restricted:
        raise UserError(f"{where}: a drafter over the target's whole vocabulary (no d2t/t2d) is not imported yet; "
                        "import one with a draft vocabulary (draft_vocab_size below vocab_size)")
    mtp_cfg.eagle3 = Eagle3Options(**{k.split(".")[-1]: v for k, v in fields.items() if k.startswith("mtp.eagle3.")})
    mtp_cfg.freeze_base = True


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family, target=None,
               speculative: Optional[int] = None) -> dict:
    """speculators' config.json; its verifier is the target's export (``target``)."""
    if dtype == "fp8":
        raise UserError("--dtype fp8 would store the EAGLE-3 drafter's linears in FP8 blocks, which speculators does "
                        "not read; export with --dtype bf16 or fp32, or the target alone with --mtp none")
    return hf.speculators_config(drafter_shape(cfg), speculative or cfg.mtp.num_layers,
                                 "float32" if dtype == "fp32" else "bfloat16", cfg.training.seq_length,
                                 str(target) if target is not None else None, [family.architecture])


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    """Separate (OUT/mtp, where vLLM and SGLang read a drafter) unless told none or only."""
    if not has_mtp:
        return mtp
    if mtp == "inline" or mtp_layout == "nextn":
        what = "--mtp inline" if mtp == "inline" else "--mtp-layout nextn"
        raise UserError(f"{what} puts MTP layers among the target's, and this checkpoint's EAGLE-3 drafter is a model "
                        "of its own (speculators' format) that the engines load from its own directory; export with "
                        "--mtp separate (OUT/mtp) or --mtp only")
    return mtp or "separate"


def _words(e) -> str:
    return (f"an EAGLE-3 drafter in mtp/ (speculators' Eagle3DraftModel, trained for {e.depth} draft "
            f"step{'s' if e.depth > 1 else ''}; the target is unchanged in main/)")


def _unserved(title: str) -> Optional[str]:
    if title != "transformers":
        return None
    return ("transformers has no EAGLE-3 drafting, so it serves the target of this export without the drafter; "
            "draft with vLLM or SGLang (--for vllm or --for sglang)")


def serving_flags() -> dict:
    """vLLM (method eagle3) and SGLang (EAGLE3) draft with it from mtp/; transformers does not."""
    return {"draft": DraftServing(
        kind="eagle3", own_model=True, words=_words, unserved=_unserved, sglang_how="EAGLE3: the drafter",
        layout_words="separate: main/ holds the target, mtp/ its EAGLE-3 drafter (speculators' format)",
        vllm_method="eagle3", sglang_algorithm="EAGLE3")}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {}
