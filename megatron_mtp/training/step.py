"""One forward step for megatron-core's pipeline schedules, and the loss it reports."""

from __future__ import annotations

from functools import partial

import torch

from megatron_mtp.training.metrics import MTPMetrics


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Masked mean LM cross entropy of one micro-batch (MTP losses enter through backward)."""
    losses = output_tensor.float()
    mask = loss_mask.float()
    loss = torch.sum(losses * mask) / mask.sum().clamp(min=1)
    return loss, {"lm loss": loss.detach().clone()}


def make_forward_step(metrics: MTPMetrics | None):
    def forward_step(data_iterator, model):
        batch = next(data_iterator)
        if metrics is not None:
            metrics.start_microbatch(batch["labels"], batch["loss_mask"])
        output = model(
            batch["tokens"], batch["position_ids"], None,
            labels=batch["labels"], loss_mask=batch["loss_mask"],
        )
        return output, partial(loss_func, batch["loss_mask"])

    return forward_step
