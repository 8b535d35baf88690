"""Validation: LM loss, per-depth MTP loss and teacher-forced draft acceptance.

Used by periodic evaluation during training and by `megatron-mtp eval`. Losses are token-weighted
means; MTP depth k is scored at positions t whose target t+1+k lies inside the window.
"""

from __future__ import annotations

import torch

from megatron_mtp.platform import all_reduce_sum
from megatron_mtp.training.batches import MicroBatchIterator
from megatron_mtp.training.hooks import attach_metrics
from megatron_mtp.training.metrics import MTPMetrics


def _eval_loss_func(loss_mask, output_tensor):
    losses = output_tensor.float()
    mask = loss_mask.float()
    total = torch.sum(losses * mask)
    count = mask.sum()
    return total / count.clamp(min=1), {"lm_sum": total.detach().clone(), "lm_count": count.detach().clone()}


def evaluate_batches(session, batches, num_microbatches: int, metrics: MTPMetrics | None,
                     micro_batch_size: int, seq_length: int) -> dict:
    """Run forward-only over `num_microbatches` micro-batches from the iterator `batches`."""
    from functools import partial

    from megatron.core.pipeline_parallel import get_forward_backward_func

    cfg, lay = session.cfg, session.layout
    model = session.components.model
    for chunk in model:
        chunk.eval()
    if metrics is not None:
        metrics.reset()
        metrics.compute_ce = True
        was_active, metrics.active = metrics.active, True

    def forward_step(data_iterator, chunk):
        batch = {k: v.to(session.platform.device) for k, v in next(data_iterator).items()}
        if metrics is not None:
            metrics.start_microbatch(batch["labels"], batch["loss_mask"])
        out = chunk(batch["tokens"], batch["position_ids"], None, labels=batch["labels"], loss_mask=batch["loss_mask"])
        return out, partial(_eval_loss_func, batch["loss_mask"])

    with torch.no_grad():
        outputs = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=batches, model=model,
            num_microbatches=num_microbatches, seq_length=seq_length,
            micro_batch_size=micro_batch_size, forward_only=True,
        )
    for chunk in model:
        chunk.train()
    d = cfg.mtp.num_layers
    dd = max(d, 1)
    vec = torch.zeros(2 + 3 * dd, dtype=torch.float64)
    if lay.is_last_stage and lay.tp_rank == 0:
        for o in outputs or []:
            vec[0] += float(o["lm_sum"])
            vec[1] += float(o["lm_count"])
        if metrics is not None:
            vec[2:2 + dd] = metrics.sums[2]
            vec[2 + dd:2 + 2 * dd] = metrics.sums[0]
            vec[2 + 2 * dd:2 + 3 * dd] = metrics.sums[3]
    if metrics is not None:
        metrics.compute_ce = False
        metrics.active = was_active
        metrics.reset()
    vec = all_reduce_sum(vec)
    counts = [max(float(vec[2 + 2 * dd + i]), 1.0) for i in range(d)]
    return {
        "lm_loss": float(vec[0]) / max(float(vec[1]), 1.0),
        "mtp_loss": [float(vec[2 + i]) / counts[i] for i in range(d)],
        "mtp_acceptance": [float(vec[2 + dd + i]) / counts[i] for i in range(d)],
        "tokens": int(vec[1]),
    }


def evaluate(session, global_batches: int, metrics: MTPMetrics | None) -> dict:
    """Evaluate `global_batches` global batches of the validation split."""
    cfg, lay = session.cfg, session.layout
    t = cfg.training
    num_micro = t.global_batch_size // (t.micro_batch_size * lay.dp) * global_batches
    batches = MicroBatchIterator(session.valid_dataset, 0, t.micro_batch_size, lay.dp_rank, lay.dp,
                                 device=session.platform.device)
    return evaluate_batches(session, batches, num_micro, metrics, t.micro_batch_size, t.seq_length)


def session_metrics(session) -> MTPMetrics | None:
    metrics, _ = attach_metrics(session.components.model[0], session.cfg, session.layout)
    return metrics
