"""The forward step megatron-core's schedules call, and the loss it reports (training, evaluation
and the logits probe all use this one)."""

from __future__ import annotations

from functools import partial
from typing import Optional

import torch

from megatron_mtp.models.context_parallel import local_batch, over_context
from megatron_mtp.training.metrics import MTPMetrics


def masked_lm_loss(loss_mask: torch.Tensor, output_tensor: torch.Tensor, cp_group=None):
    """Masked mean LM cross entropy of one micro-batch, plus its sum and token count.

    The MTP losses enter through backward inside GPTModel (MTPLossAutoScaler), not here. With context
    parallelism (``cp_group``) the micro-batch's tokens are spread over the group: the mean is over all
    of them and the sum and count reported are the whole micro-batch's (models/context_parallel.py).
    """
    mask = loss_mask.float()
    total = torch.sum(output_tensor.float() * mask)
    count = mask.sum()
    if cp_group is None:
        return total / count.clamp(min=1), {"lm_sum": total.detach().clone(), "lm_count": count.detach().clone()}
    whole, whole_sum = over_context(count, total, cp_group)  # megatron-core's schedule multiplies by CP (the note)
    return total / whole.clamp(min=1), {"lm_sum": whole_sum, "lm_count": whole}


def micro_batch_mean(reported: dict) -> float:
    """The mean LM loss of one micro-batch from what `masked_lm_loss` reported."""
    return float(reported["lm_sum"]) / max(float(reported["lm_count"]), 1.0)


def _backward_mtp_only(model, num_microbatches: int, loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """The loss function of a frozen-base step (mtp.freeze_base): the schedule runs forward-only, so
    the MTP objective the model kept of this micro-batch is back-propagated here, scaled as
    megatron-core's schedule scales a loss (1 / micro-batches, times the grad scale), with the MoE aux
    losses of the MTP layers at that same scale; then the LM loss is reported as usual."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    from megatron_mtp.training.components import unwrap

    inner = unwrap(model)
    objective, inner.mtp_objective = inner.mtp_objective, None
    if objective is not None:
        config = inner.config
        one = torch.ones(1, device=objective.device)
        scale = (config.grad_scale_func(one) if config.grad_scale_func is not None else one) / num_microbatches
        MoEAuxLossAutoScaler.set_loss_scale(scale)
        torch.autograd.backward(objective * scale.squeeze())
    return masked_lm_loss(loss_mask, output_tensor)


def make_forward_step(metrics: Optional[MTPMetrics], device: Optional[str] = None,
                      mtp_only_microbatches: Optional[int] = None):
    """forward_step(data_iterator, model[, return_schedule_plan]) for megatron-core's schedules.

    ``metrics``: told about each micro-batch's labels before the forward (its output-layer hook
    then measures acceptance); ``device``: where to move batches that arrive elsewhere;
    ``mtp_only_microbatches``: a frozen-base training step of that many micro-batches, run by a
    forward-only schedule (the loss function back-propagates the MTP objective itself).
    """

    cp_group, cp, cp_rank = _context_parallel()

    def forward_step(data_iterator, model, return_schedule_plan: bool = False):
        batch = next(data_iterator)
        if device is not None:
            batch = {k: v.to(device) for k, v in batch.items()}
        batch = local_batch(batch, cp_rank, cp)  # parallel.context: this rank's chunks of each sequence
        # a stage reads only what it uses (training/batches.py): a middle stage gets no tokens or labels
        labels, loss_mask = batch.get("labels"), batch.get("loss_mask")
        if metrics is not None and labels is not None:
            metrics.start_microbatch(labels, loss_mask)
        args = (batch.get("tokens"), batch.get("position_ids"), batch.get("attention_mask"))  # None: causal
        kwargs = {"labels": labels, "loss_mask": loss_mask}
        # the expert-parallel all-to-all overlap schedule asks for a plan of the forward instead
        output = model.build_schedule_plan(*args, **kwargs) if return_schedule_plan else model(*args, **kwargs)
        if mtp_only_microbatches is not None:
            return output, partial(_backward_mtp_only, model, mtp_only_microbatches, loss_mask)
        return output, partial(masked_lm_loss, loss_mask, cp_group=cp_group)

    return forward_step


def _context_parallel():
    """(group or None, size, rank) of this rank's context-parallel group."""
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized() or parallel_state.get_context_parallel_world_size() == 1:
        return None, 1, 0
    return (parallel_state.get_context_parallel_group(), parallel_state.get_context_parallel_world_size(),
            parallel_state.get_context_parallel_rank())
