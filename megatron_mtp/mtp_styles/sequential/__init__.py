"""DeepSeek-V3's sequential MTP modules (``mtp.style: sequential``, the default): megatron-core's
MultiTokenPredictionBlock inside the GPTModel; depth k reads depth k-1's hidden state and the embedding of
token t+k through its own enorm, hnorm and eh_proj. The family gives the block its MTP spec."""

from __future__ import annotations

from megatron_mtp.config.lazy import lazy_module
from megatron_mtp.config.mtp_style import MTPStyle, register_style
from megatron_mtp.models.tensor_table import mcore_mtp_prefix, mtp_own_rules


def _eh_proj_flops(cfg) -> float:
    """A module's eh_proj: [2h] -> h per token."""
    return 2 * 2 * cfg.model.hidden_size * cfg.model.hidden_size


def words(mtp) -> str:
    return f"{mtp.modules} sequential MTP module{'s' if mtp.modules > 1 else ''}"


def parts(mtp) -> list[str]:
    """One prefix per module that holds weights (one for every depth with mtp.repeated_layer)."""
    return [mcore_mtp_prefix(d) for d in range(mtp.modules)]


def wrap(cfg, platform, family_parts) -> None:
    """megatron-core's own MTP block: nothing replaces it."""
    return None


SEQUENTIAL = register_style(MTPStyle(
    name="sequential", chains_modules=True, separate_drafter=False, soft_targets=True, head_by_head=False,
    a2a_overlap=True, context_parallel=True, drafts=True, words=words, key_prefix="mtp.",
    tensor_rows=lambda table, *args: table.mtp_module_params(*args),
    own_rules=mtp_own_rules, own_flops=_eh_proj_flops, drafter_words="the MTP module",
    plan=lazy_module("megatron_mtp.mtp_styles.sequential.plan"),
    convert=lazy_module("megatron_mtp.mtp_styles.sequential.convert"),
    decoder=lazy_module("megatron_mtp.mtp_styles.sequential.decoder"),
    hf_inline=True, parts=parts, wrap=wrap,
    summary="DeepSeek-V3's chained modules (depth k also reads the embedding of token t+k)",
))
