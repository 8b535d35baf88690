"""Validation: LM loss, per-depth MTP loss and teacher-forced draft acceptance.

Used by periodic evaluation during training and by `megatron-mtp eval`. Losses are token-weighted
means; MTP depth k is scored at positions t whose target t+1+k lies inside the window. During
training, a save-and-exit signal ends an evaluation after the global batch it arrived in (agreed by
every rank, like the step's agreement), so the save is not kept waiting for the whole evaluation.
"""

from __future__ import annotations

import itertools

import torch

from megatron_mtp.platform import all_reduce_sum
from megatron_mtp.training.batches import MicroBatchIterator, stage_keys
from megatron_mtp.training.forward_step import make_forward_step
from megatron_mtp.training.metric_hooks import attach_metrics
from megatron_mtp.training.metrics import MTPMetrics
from megatron_mtp.training.sums import NamedSums


def evaluate_batches(session, batches, num_microbatches: int, metrics: MTPMetrics | None,
                     micro_batch_size: int, seq_length: int, stop=None, per_batch: int | None = None) -> dict:
    """Run forward-only over `num_microbatches` micro-batches from the iterator `batches`. With `stop`
    (asked on every rank after each `per_batch` micro-batches, and agreed: the evaluation runs
    collectives), the evaluation ends early when any rank's `stop()` is true; the result is then
    {"stopped_after": batches evaluated} alone."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    cfg, ranks = session.cfg, session.ranks
    model = session.components.model
    per_batch = per_batch or num_microbatches
    for chunk in model:
        chunk.eval()
    if metrics is not None:
        metrics.reset()
        metrics.compute_ce = True
        was_active, metrics.active = metrics.active, True
    outputs: list = []
    done, stopped_after = 0, None
    with torch.no_grad():
        while done < num_microbatches:
            count = min(per_batch, num_microbatches - done)
            data = batches
            if len(model) > 1:  # the interleaved schedule reads the same micro-batches once per chunk
                taken = list(itertools.islice(batches, count))
                data = [iter(taken) for _ in model]
            outputs += get_forward_backward_func()(
                forward_step_func=make_forward_step(metrics, device=session.platform.device), data_iterator=data,
                model=model, num_microbatches=count, seq_length=seq_length,
                micro_batch_size=micro_batch_size, forward_only=True,
            ) or []
            done += count
            if stop is not None and done < num_microbatches and _any_rank(stop()):
                stopped_after = done // per_batch
                break
    for chunk in model:
        chunk.train()
    if stopped_after is not None:
        if metrics is not None:
            metrics.compute_ce, metrics.active = False, was_active
            metrics.reset()
        return {"stopped_after": stopped_after}
    depth = cfg.mtp.num_layers
    sums = NamedSums(lm_sum=1, lm_count=1, mtp_ce=depth, accepted=depth, judged=depth)
    sums["lm_sum"], sums["lm_count"] = lm_totals(outputs, ranks)
    if ranks.is_last_stage and ranks.tp_rank == 0:  # the ranks that hold the MTP sums of their own tokens
        if metrics is not None:
            sums["mtp_ce"] = metrics.sums["ce_sum"]
            sums["accepted"] = metrics.sums["accepted"]
            sums["judged"] = metrics.sums["judged"]
    if metrics is not None:
        metrics.compute_ce = False
        metrics.active = was_active
        metrics.reset()
    total = sums.all_reduced()
    judged = total["judged"].clamp(min=1.0)
    return {
        "lm_loss": total.value("lm_sum") / max(total.value("lm_count"), 1.0),
        "mtp_loss": (total["mtp_ce"] / judged).tolist(),
        "mtp_acceptance": (total["accepted"] / judged).tolist(),
        "tokens": int(total.value("lm_count")),
    }


def lm_totals(outputs, ranks) -> tuple[float, float]:
    """This rank's share of the LM loss sum and scored tokens of the micro-batches' ``outputs`` (what the loss
    function reported): each is the whole micro-batch's on every tensor- and context-parallel rank of the last stage
    (training/forward_step.py sums over the CP ranks), so one of them, TP and CP rank 0, counts it per data-parallel
    replica; every other rank adds 0."""
    if not (ranks.is_last_stage and ranks.tp_rank == 0 and ranks.cp_rank == 0):
        return 0.0, 0.0
    return (sum(float(reported["lm_sum"]) for reported in outputs or []),
            sum(float(reported["lm_count"]) for reported in outputs or []))


def _any_rank(flag: bool) -> bool:
    return bool(all_reduce_sum(torch.tensor([float(flag)]))[0] > 0)


def evaluate(session, global_batches: int, metrics: MTPMetrics | None, stop=None) -> dict:
    """Evaluate `global_batches` global batches of the validation split (`stop`: asked after each
    global batch, see evaluate_batches)."""
    t, ranks = session.cfg.training, session.ranks
    num_micro = t.global_batch_size // (t.micro_batch_size * ranks.dp) * global_batches
    batches = MicroBatchIterator(session.valid_dataset, 0, t.micro_batch_size, ranks.dp_rank, ranks.dp,
                                 device=session.platform.device,
                                 keys=stage_keys(ranks.pp_rank, ranks.pp, session.cfg.data.reset_attention_mask))
    return evaluate_batches(session, batches, num_micro, metrics, t.micro_batch_size, t.seq_length, stop=stop,
                            per_batch=num_micro // global_batches if stop is not None else None)


def session_metrics(session) -> MTPMetrics | None:
    metrics, _ = attach_metrics(session.components.model, session.cfg, session.ranks)
    return metrics
