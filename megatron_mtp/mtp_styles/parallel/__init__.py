"""Gloeckle et al.'s parallel MTP heads (``mtp.style: parallel``): independent heads, one decoder layer each of the
family's MTP layer spec on the trunk's last hidden state, sharing the output layer (model.py; their own export
format: hf_format.py, read back by from-hf; drafted with by drafter.py)."""

from __future__ import annotations

from megatron_mtp.config.lazy import lazy_module, lazy_object
from megatron_mtp.config.mtp_style import MTPStyle, register_style
from megatron_mtp.models.tensor_table import HEAD_NORM, mcore_head_prefix

_model = lazy_object("megatron_mtp.mtp_styles.parallel.model:ParallelHeadsGPTModel")  # torch: when a run builds it


def words(mtp) -> str:
    return f"{mtp.num_layers} parallel MTP head{'s' if mtp.num_layers > 1 else ''}"


def parts(mtp) -> list[str]:
    return [mcore_head_prefix(k) for k in range(mtp.num_layers)]


def wrap(cfg, platform, family_parts):
    """The heads' GPTModel in place of megatron-core's MTP block, each head a layer of the family's MTP spec."""
    return _model(), dict(head_layer_spec=family_parts.mtp_layer_spec(),
                          head_by_head_backward=cfg.mtp.head_by_head_backward, freeze_base=cfg.mtp.freeze_base)


PARALLEL = register_style(MTPStyle(
    name="parallel", chains_modules=False, separate_drafter=False, soft_targets=False, head_by_head=True,
    a2a_overlap=False, context_parallel=False, drafts=False, words=words, key_prefix="mtp_heads.",
    tensor_rows=lambda table, model, depth, spec, copies: table.parallel_head_params(model, depth, spec),
    own_rules=lambda: [HEAD_NORM], own_flops=lambda cfg: 0.0, drafter_words="the heads",
    plan=lazy_module("megatron_mtp.mtp_styles.parallel.plan"),
    convert=lazy_module("megatron_mtp.mtp_styles.parallel.convert"),
    decoder=lazy_module("megatron_mtp.mtp_styles.parallel.decoder"),
    hf_inline=False, parts=parts, wrap=wrap,
    summary="Gloeckle et al.'s independent heads, one decoder layer each on the trunk's last hidden state, sharing "
            "the output layer",
))
