"""Guards of the training step: non-finite losses or gradients, and loss spikes.

Design note. A diverged run must stop (or skip the step) before its weights are touched and before
anything non-finite is saved. Per step, every rank contributes to ONE all-reduce (SUM) of
    [loss non-finite here, stop signal here, LM loss here, holds the LM loss, time-based save due here]
which replaces the stop-signal agreement the loop needs anyway, so the guard costs no extra
collective. The gradient norm comes from megatron-core's own computation over the gradient-stats
group (global), after `prepare_grads` (which also performs its fp16 loss-scale inf check); only
then does the optimizer step run, exactly as megatron-core's ChainedOptimizer.step would
(clip by the total norm, step_with_ready_grads). Every rank therefore reaches the same decision:
    step        all finite
    skip        non-finite and training.on_nonfinite=skip (up to max_skipped_steps in a row),
                or an fp16 loss-scale overflow (megatron-core lowers the scale and skips)
    stop        non-finite otherwise: one sentence naming the step and the last checkpoint
The loss-spike rule watches the global LM loss of stepped steps: `patience` steps in a row above
`factor` × the median of the last `window` finite steps trigger it (stop, or roll back to the
newest checkpoint saved before the spike began and skip the data since, see trainer.py).

Fault injection, for the tests of these guards only: MEGATRON_MTP_INJECT_NONFINITE="3,4" makes the
losses of steps 3 and 4 count as non-finite on every rank; MEGATRON_MTP_INJECT_SPIKE="6-8"
multiplies the loss the spike rule sees at steps 6 to 8 by 100; MEGATRON_MTP_INJECT_SIGNAL="3" makes each
rank send itself SIGUSR1 after the forward/backward of step 3 (a signal that arrives during a step);
MEGATRON_MTP_INJECT_EVAL_SIGNAL="2" makes rank 0 alone send itself SIGUSR1 after the first batch of the
evaluation at step 2 (the other ranks learn it at the evaluation's agreement). The checkpoint writer's
injections (slow, stuck) are in platform/write_progress.py.
"""

from __future__ import annotations

import math
import os
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Optional

import torch

from megatron_mtp.platform import all_reduce_sum


def injected_steps(name: str) -> frozenset[int]:
    """Steps named by MEGATRON_MTP_INJECT_<name> ("3,4,6-8"); empty when unset."""
    steps: set[int] = set()
    for part in filter(None, os.environ.get(f"MEGATRON_MTP_INJECT_{name}", "").split(",")):
        low, _, high = part.partition("-")
        steps.update(range(int(low), int(high or low) + 1))
    return frozenset(steps)


@dataclass
class Agreement:
    """What all ranks agreed on after the forward/backward of one step."""

    loss_nonfinite: bool
    stop_signal: bool
    lm_loss: Optional[float]
    """The global mean LM loss of the step (None if no rank holds it)."""
    save_due: bool = False
    """A time-based save is due (checkpoint.save_interval_minutes, by rank 0's clock)."""


def agree(loss_nonfinite: bool, stop_signal: bool, lm_loss: Optional[float], save_due: bool = False) -> Agreement:
    """One all-reduce: any rank's non-finite loss, signal or due save, and the mean LM loss over its holders."""
    held = lm_loss is not None
    vector = torch.tensor([float(loss_nonfinite), float(stop_signal), lm_loss if held and math.isfinite(lm_loss)
                           else 0.0, float(held), float(save_due)], dtype=torch.float64)
    total = all_reduce_sum(vector)
    holders = float(total[3])
    return Agreement(bool(total[0] > 0), bool(total[1] > 0), float(total[2]) / holders if holders else None,
                     bool(total[4] > 0))


def losses_finite(reported: list, mtp_losses) -> bool:
    """Whether this rank's LM losses (schedule reports) and per-depth MTP losses are finite."""
    for item in reported or []:
        if not math.isfinite(float(item["lm_sum"])):
            return False
    return mtp_losses is None or bool(torch.isfinite(mtp_losses).all())


@dataclass
class StepOutcome:
    stepped: bool
    grad_norm: float
    reason: Optional[str] = None
    """Why the step was not taken: 'non-finite loss', 'non-finite gradients', 'fp16 loss-scale overflow'."""


def guarded_optimizer_step(optimizer, loss_nonfinite: bool) -> StepOutcome:
    """megatron-core's ChainedOptimizer.step, with the update withheld when anything is non-finite."""
    from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

    if optimizer.prepare_grads():  # fp16 loss scaling found inf/nan (already agreed by megatron-core)
        return StepOutcome(False, float("nan"), "fp16 loss-scale overflow")
    grad_norm = float(optimizer.get_grad_norm())
    if loss_nonfinite:
        return StepOutcome(False, grad_norm, "non-finite loss")
    if not math.isfinite(grad_norm):
        return StepOutcome(False, grad_norm, "non-finite gradients")
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        if getattr(inner, "is_stub_optimizer", False) or inner.config.clip_grad <= 0.0:
            continue
        parameters = inner.get_parameters()
        if parameters:
            clip_grad_by_total_norm_fp32(
                parameters, max_norm=inner.config.clip_grad, total_norm=grad_norm,
                use_decoupled_grad=inner.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
            )
    if not optimizer.step_with_ready_grads():
        return StepOutcome(False, grad_norm, "optimizer reported a failed update")
    return StepOutcome(True, grad_norm)


class LossSpikeDetector:
    """`patience` stepped steps in a row with loss > factor × median of the last `window` losses."""

    def __init__(self, factor: float, window: int, patience: int):
        self.factor = factor
        self.patience = patience
        self.recent: deque[float] = deque(maxlen=window)
        self.run: list[int] = []  # steps of the current run of spiking losses

    def observe(self, step: int, loss: float) -> Optional[int]:
        """Record a stepped step's loss; returns the first step of the spike when the rule fires."""
        if len(self.recent) >= min(self.recent.maxlen or 1, 2 * self.patience):
            median = statistics.median(self.recent)
            if loss > self.factor * median:
                self.run.append(step)
                if len(self.run) >= self.patience:
                    return self.run[0]
                return None
        self.run.clear()
        self.recent.append(loss)
        return None

    def reset(self) -> None:
        self.recent.clear()
        self.run.clear()
