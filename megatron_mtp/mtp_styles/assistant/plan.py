"""What ``plan`` counts of a separate drafter: its parameters (its family's table of them, registered after
GPTModel's own modules), its K steps' saved activations (plan/activations.py ``assistant``), its tensor-parallel
traffic on the loss stage (plan/comm.py ``assistant_tp``) and its sentence."""

from __future__ import annotations

import math

from megatron_mtp.models.family import get_family
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.comm import assistant_tp as drafter_tp  # noqa: F401  (its K steps' TP traffic)
from megatron_mtp.plan.params import Param
from megatron_mtp.plan.speculative import assistant_step_bytes as draft_step_bytes  # noqa: F401  (one draft step)


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list[Param]:
    """Parameters of the drafter on the stage that holds it: its family's table of them."""
    if not stage.mtp_layers:
        return []
    tensors = get_family(cfg.model.family).style_part(cfg.mtp.style).tensors(cfg, padded_vocab)
    return [Param(t.mcore, math.prod(t.shape) // (sizes.tp if t.tp else 1),
                  linear=".linear_" in t.mcore and t.mcore.endswith(".weight")) for t in tensors if not t.buffer]


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, act.Saved]]:
    """Its K steps on the loss stage."""
    return [("mtp_assistant.", act.assistant(cfg, d, k, cfg.mtp.num_layers))] if stage.mtp_layers else []


def assumption(cfg):
    a = cfg.mtp.assistant
    return (f"MTP: an assistant ({a.num_layers} layers of width {a.hidden_size}, its own output table) drafting "
            f"{cfg.mtp.num_layers} steps on the loss stage over the frozen target's stored keys/values "
            "(plan/activations.py assistant)")
