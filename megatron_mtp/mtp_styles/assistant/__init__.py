"""A separate drafter on the frozen target (``mtp.style: assistant``; Gemma 4's assistant,
models/gemma4/assistant/): a small model of its own widths (mtp.assistant) reading the target's stored keys and
values and its last hidden state, applied mtp.num_layers times; exported to a directory of its own."""

from __future__ import annotations

from megatron_mtp.config.lazy import lazy, lazy_module, lazy_object
from megatron_mtp.config.mtp_style import MTPStyle, register_style
from megatron_mtp.models.tensor_table import mtp_own_rules
from megatron_mtp.mtp_styles.assistant.options import check_assistant

PREFIX = "mtp_assistant."
"""The checkpoint keys of the drafter (one part, whatever its depth)."""

def _eh_proj_flops(cfg) -> float:
    """A module's eh_proj: [2h] -> h per token."""
    return 2 * 2 * cfg.model.hidden_size * cfg.model.hidden_size


def words(mtp) -> str:
    return "an assistant"


def parts(mtp) -> list[str]:
    return [PREFIX]


def wrap(cfg, platform, family_parts):
    """The family's drafter GPTModel, which keeps the frozen target's keys/values and trains the drafter."""
    m = cfg.mtp
    return family_parts.drafter_model(), dict(run_config=cfg, platform=platform, step_weights=m.assistant.step_weights,
                                              targets=m.targets, self_weight=m.self_weight,
                                              self_temperature=m.self_temperature)


ASSISTANT = register_style(MTPStyle(
    name="assistant", chains_modules=False, separate_drafter=True, soft_targets=True, head_by_head=False,
    a2a_overlap=False, context_parallel=False, drafts=True, words=words, key_prefix=PREFIX,
    tensor_rows=lambda *args: [],
    own_rules=mtp_own_rules, own_flops=_eh_proj_flops, drafter_words="the assistant",
    plan=lazy_module("megatron_mtp.mtp_styles.assistant.plan"),
    convert=lazy_module("megatron_mtp.mtp_styles.assistant.convert"),
    decoder=lazy_module("megatron_mtp.mtp_styles.assistant.decoder"),
    hf_inline=False, parts=parts, wrap=wrap, check=check_assistant,
    summary="a separate small model of its own width (mtp.assistant) reading the frozen target's stored keys and "
            "values and last hidden state, applied D times (Gemma 4)",
    family_part=lazy("megatron_mtp.mtp_styles.assistant.family_part:family_part"),
    drafter_flops=lazy("megatron_mtp.mtp_styles.assistant.plan:step_flops"),
    options=lazy_object("megatron_mtp.mtp_styles.assistant.options:AssistantOptions"),
))
