"""EAGLE-3 (``mtp.style: eagle3``; README.md here): a small dense decoder trained beside the frozen target on its
hidden states at a few layers (mtp.eagle3), its mtp.num_layers "training-time test" steps each reading its own
previous output, scored over a draft vocabulary against the target's own distribution; exported in the speculators
format (hf.py, convert.py)."""

from __future__ import annotations

from megatron_mtp.config.lazy import lazy, lazy_module, lazy_object
from megatron_mtp.config.mtp_style import MTPStyle, register_style
from megatron_mtp.mtp_styles.eagle3.shape import PREFIX, check

_model = lazy_object(  # torch and megatron-core: imported when a run builds it
    "megatron_mtp.mtp_styles.eagle3.model:Eagle3GPTModel")


def words(mtp) -> str:
    return "an EAGLE-3 drafter"


def parts(mtp) -> list[str]:
    return [PREFIX]


def wrap(cfg, platform, family_parts):
    """The target's GPTModel with the drafter on its loss stage; it needs nothing of the family's folder."""
    return _model(), dict(run_config=cfg, platform=platform)


def own_flops(cfg) -> float:
    """Per token, what a step computes besides a layer and the output head: fc, once per token, shared out over the
    steps (a step's whole count, which an MTP-only step uses, is ``drafter_flops``: plan.py ``step_flops``)."""
    e, h = cfg.mtp.eagle3, cfg.model.hidden_size
    aux = len(e.aux_layers) if e.aux_layers is not None else 3
    return 2 * aux * h * h / max(cfg.mtp.num_layers, 1)


EAGLE3 = register_style(MTPStyle(
    name="eagle3", chains_modules=False, separate_drafter=True, soft_targets=False, head_by_head=False,
    a2a_overlap=False, context_parallel=False, drafts=True, words=words, key_prefix=PREFIX, any_family=True,
    observes_predictions=True,
    tensor_rows=lambda *args: [], own_rules=lambda: [], own_flops=own_flops, drafter_words="the EAGLE-3 drafter",
    plan=lazy_module("megatron_mtp.mtp_styles.eagle3.plan"),
    convert=lazy_module("megatron_mtp.mtp_styles.eagle3.convert"),
    decoder=lazy_module("megatron_mtp.mtp_styles.eagle3.decoder"),
    hf_inline=False, parts=parts, wrap=wrap, check=check,
    summary="an EAGLE-3 drafter (mtp.eagle3): a small decoder on the frozen target's hidden states at a few layers, "
            "D training-time-test steps over a draft vocabulary, in speculators' format",
    drafter_flops=lazy("megatron_mtp.mtp_styles.eagle3.plan:step_flops"),
    options=lazy_object("megatron_mtp.mtp_styles.eagle3.options:Eagle3Options"),
))
