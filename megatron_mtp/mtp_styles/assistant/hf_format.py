"""A separate drafter's Hugging Face directory (mtp.style assistant): Gemma 4's ``gemma4_assistant`` beside
an unchanged target, both ways.

Design note. The converters stream tensors through one table of ``Param`` rows; the assistant's rows
(the family's ``assistant_tensors``, models/gemma4/assistant/hf_mapping.py) are part "mtp" and name their HF
tensors as a separate drafter's (convert/drafter_dir.py): apart from the target's tensors of the same name
while the table is one list, under their own names in the assistant directory (``to-hf``: OUT/mtp, or OUT with
``--mtp only``; ``from-hf --mtp-dir``). Its config.json is transformers'
Gemma4AssistantConfig; its generation_config.json says how many tokens it drafts
(``num_assistant_tokens``: mtp.num_layers, the steps it was trained for, or ``--speculative``).
"""

from __future__ import annotations

from typing import Any, Optional

from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.convert.drafter_dir import table_name
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import assistant_family, get_family
from megatron_mtp.models.tensor_table import Param
from megatron_mtp.mtp_styles.assistant.options import AssistantOptions

RELEASE_DRAFT_TOKENS = 6
"""num_assistant_tokens of the released assistants' generation_config.json."""


def is_assistant_config(config: dict[str, Any]) -> bool:
    """A config.json of a separate drafter (its model_type: models/family.py ``assistant_family``)."""
    return assistant_family(config) is not None


def assistant_params(cfg, vocab: int) -> list[Param]:
    """The assistant's table rows (module note); [] for a run without one."""
    if not (cfg.mtp.num_layers and get_style(cfg.mtp.style).separate_drafter):
        return []
    drafter = get_family(cfg.model.family).style_part(cfg.mtp.style)
    if drafter is None:
        raise UserError(f"mtp.style={cfg.mtp.style} is not built for model.family={cfg.model.family}")
    return [Param(t.mcore, tuple(table_name(h) for h in t.hf), "mtp", transform=t.transform)
            for t in drafter.tensors(cfg, vocab)]


def shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    """megatron-core key -> global shape of every assistant tensor ({} for a run without one; the shape checks'
    ``drafter``, convert/shapes.py)."""
    if not (cfg.mtp.num_layers and get_style(cfg.mtp.style).separate_drafter):
        return {}
    return {t.mcore: t.shape for t in get_family(cfg.model.family).style_part(cfg.mtp.style).tensors(cfg, vocab)}


def check_layout(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str]) -> str:
    """The --mtp of an export with an assistant: separate (the engines' layout) unless told none or only; the
    layouts that would put it among the target's tensors are one sentence."""
    if mtp == "inline" or mtp_layout == "nextn":
        what = "--mtp inline" if mtp == "inline" else "--mtp-layout nextn"
        raise UserError(f"{what} puts MTP layers among the target's, and this checkpoint's drafter is a model of its "
                        "own (mtp.style assistant) that the engines load from its own directory; export with --mtp "
                        "separate (OUT/mtp) or --mtp only")
    return mtp or "separate"


def draft_tokens(path) -> int:
    """Tokens an assistant directory drafts per round: its generation_config.json's num_assistant_tokens, else
    the releases' 6 (what the imported run trains its steps for: mtp.num_layers)."""
    import json
    from pathlib import Path

    try:
        value = json.loads((Path(path) / "generation_config.json").read_text()).get("num_assistant_tokens")
    except (OSError, ValueError, AttributeError):
        value = None
    return int(value) if isinstance(value, int) and value > 0 else RELEASE_DRAFT_TOKENS


def shape_from_hf(raw: dict[str, Any], target, vocab: int, where: str):
    """The ``mtp.assistant`` options of an assistant's config.json drafting for ``target`` (the fields the reader of
    the family whose drafter it is reads)."""
    family = assistant_family(raw)
    drafter = _drafter_of(family, raw)
    if drafter is None:
        raise UserError(f"{where}: model_type {raw.get('model_type')!r} is not a separate drafter megatron-mtp reads")
    return AssistantOptions(**drafter.shape_from_hf(raw, target, vocab, where))


def _drafter_of(family, raw: dict[str, Any]):
    """The separate drafter of ``family`` whose model_type ``raw`` has (None: none)."""
    parts = family.style_parts.values() if family is not None else ()
    return next((p for p in parts if getattr(p, "model_type", None) == raw.get("model_type")), None)


def configs(cfg, vocab: int, torch_dtype: str, speculative: Optional[int]) -> tuple[dict, dict]:
    """(config.json, generation_config.json) of the assistant directory."""
    drafter = get_family(cfg.model.family).style_part(cfg.mtp.style)
    if drafter is None:
        raise UserError(f"mtp.style={cfg.mtp.style} is not built for model.family={cfg.model.family}")
    return (drafter.hf_config(cfg, vocab, torch_dtype),
            {"num_assistant_tokens": int(speculative or cfg.mtp.num_layers),
             "num_assistant_tokens_schedule": "constant"})
