"""What one logging interval accumulates, and the scalars it logs.

Every logged scalar is layout-independent: the same weights and data give the same values at any
TP/PP/EP/DP layout (tested in tests/dist/test_train_layouts.py).
  - Losses and acceptance live on the last pipeline stage; each data-parallel replica counts once
    (its TP rank 0), so the sums are averaged over replicas.
  - megatron-core's MoE balance-loss tracker holds, per layer, a partial value on each TP rank
    (each rank sees its sequence-parallel slice) and each context-parallel rank (its chunks of the
    sequences); the parts sum to the layer's value. We sum
    over all ranks and divide by the number of TP-rank-0 ranks that saw the layer, i.e. the
    replicas, which is what megatron-core's reduce_aux_losses_tracker_across_ranks computes.
  - The MoE scalars: moe_metrics.py. DeepSeek Sparse Attention's indexer KL loss (megatron-core's DSA
    tracker, before its coefficient) is whole on every TP rank and a mean over its chunks on each CP rank:
    TP rank 0's values are averaged per layer over the data- and context-parallel ranks, and logged per
    layer (indexer_loss_values); the MTP layers' are kept apart from the decoder layers' of the same number
    (platform/megatron_core.py MTPIndexerLoss).
  - grad norm, λ and lr are the same on every rank.
  - Throughput: model TFLOP/s per GPU = model FLOPs per token × tokens/s / world size, with the FLOPs
    definition `plan --mfu` uses (models/throughput.py); MFU against the GPU's peak, on GPUs only.
"""

from __future__ import annotations

import torch

from megatron_mtp.platform import all_reduce_sum
from megatron_mtp.training.forward_step import micro_batch_mean
from megatron_mtp.training.metrics import MTPMetrics, memory_gib
from megatron_mtp.training.moe_metrics import ExpertLoad
from megatron_mtp.training.sums import NamedSums


class IntervalStats:
    def __init__(self, depth: int, total_layers: int, ranks, num_microbatches: int,
                 expert_load: ExpertLoad, flops_per_token: float = 0.0, peak_tflops: float = 0.0,
                 clip_grad: float = 0.0, with_dropped: bool = False):
        """total_layers: decoder plus MTP layers (the length of megatron-core's per-layer trackers);
        flops_per_token: model FLOPs of a trained token and peak_tflops: the GPU's peak per GPU (0 on CPU),
        both as models/throughput.py defines them; clip_grad: the norm above which a step's gradients are
        clipped (0: never); with_dropped: log the dropped tokens (a capacity is set)."""
        self.with_dropped = with_dropped
        self.flops_per_token, self.peak_tflops, self.clip_grad = flops_per_token, peak_tflops, clip_grad
        self.depth = depth
        self.ranks = ranks
        self.num_micro = num_microbatches
        self.expert_load = expert_load
        # held by the last stage's TP rank 0 of each replica
        self.sums = NamedSums(lm_loss=1, replica_steps=1, mtp_loss=depth, accepted=depth, correct=depth,
                              judged=depth)
        # [sum, count] per layer of the MoE balance loss; every rank holds all layers (zeros for those on
        # other stages) so that every rank takes part in the same all-reduce
        self.aux = torch.zeros(2, total_layers, dtype=torch.float64)
        self.indexer = torch.zeros(2, total_layers, dtype=torch.float64)  # the same for the DSA indexer loss
        self.lam = 0.0
        self.lr = 0.0
        self.global_batch = 0
        """The global batch size of the last step (training.rampup_batch_size grows it)."""
        self.reset()

    def reset(self) -> None:
        self.sums.zero_()
        self.steps = 0
        self.skipped = 0
        self.tokens = 0
        """Tokens of the interval's steps, skipped ones included (each step's own global batch)."""
        self.extra: dict[str, float] = {}
        """Scalars of events in the interval (a checkpoint's save time), logged with its row."""
        self.grad_norm_sum = 0.0
        self.grad_norm_max = 0.0
        self.clipped = 0

    def count_tokens(self, tokens: int, global_batch: int) -> None:
        """A step's tokens and its global batch size (which grows during a batch-size ramp-up)."""
        self.tokens += tokens
        self.global_batch = global_batch

    def discard(self) -> None:
        """Forget the interval so far (its steps were undone by a rollback)."""
        self.reset()
        self.aux.zero_()
        self.indexer.zero_()
        self.expert_load.reset()

    @property
    def _holds_losses(self) -> bool:
        return self.ranks.is_last_stage and self.ranks.tp_rank == 0

    def add_step(self, reported: list, mtp_losses, metrics: MTPMetrics | None, lam: float, lr: float,
                 grad_norm: float | None) -> None:
        """One optimizer step: the schedule's per-micro-batch reports and megatron-core's trackers."""
        if self._holds_losses and reported:
            self.sums["lm_loss"] += sum(micro_batch_mean(r) for r in reported) / len(reported)
            self.sums["replica_steps"] += 1
            if mtp_losses is not None and self.depth:
                self.sums["mtp_loss"] += mtp_losses.double().cpu() / self.num_micro
        if metrics is not None:
            if self._holds_losses:
                for name in ("accepted", "correct", "judged"):
                    self.sums[name] += metrics.sums[name]
            metrics.reset()
        self.steps += 1
        norm = float(grad_norm or 0.0)
        self.grad_norm_sum += norm
        self.grad_norm_max = max(self.grad_norm_max, norm)
        self.clipped += int(0.0 < self.clip_grad < norm)
        self.lam, self.lr = lam, lr

    def add_balance_loss(self, layer_values: torch.Tensor, into: torch.Tensor | None = None) -> None:
        """Per-layer MoE balance loss of one step (megatron-core's tracker, before its coefficient); ``into``:
        another [sum, count] accumulator of a per-layer loss tracked the same way (the DSA indexer's)."""
        into = self.aux if into is None else into
        values = layer_values.detach().double().cpu() / self.num_micro
        into[0, :values.numel()] += values
        if self.ranks.tp_rank == 0 and self.ranks.cp_rank == 0:  # TP and CP ranks hold parts of one value
            into[1, :values.numel()] += (values != 0).double()

    def add_indexer_loss(self, layer_values: torch.Tensor) -> None:
        """Per-layer DSA indexer KL loss of one step, before its coefficient: the decoder layers', then the MTP
        layers' (platform/megatron_core.py dsa_indexer_loss_values). Every TP rank holds the whole value
        (megatron-core gathers the sequence and sums the heads' attention over TP before the KL) and each
        context-parallel rank the mean over its chunks' queries, so TP rank 0's are averaged over the
        data-parallel and context-parallel ranks."""
        if self.ranks.tp_rank != 0:
            return
        values = layer_values.detach().double().cpu() / self.num_micro
        self.indexer[0, :values.numel()] += values
        self.indexer[1, :values.numel()] += (values != 0).double()

    def _balance_loss(self, of: torch.Tensor | None = None) -> float:
        of = self.aux if of is None else of
        totals = all_reduce_sum(of.clone())
        of.zero_()
        seen = totals[1] > 0
        return float((totals[0][seen] / totals[1][seen]).mean()) if bool(seen.any()) else 0.0

    def _indexer_loss(self) -> dict[str, float]:
        """The DSA indexer loss scalars where one was tracked on any rank (every rank all-reduces)."""
        totals = all_reduce_sum(self.indexer.clone())
        self.indexer.zero_()
        return indexer_loss_values(totals, self.indexer.shape[1] - self.depth)

    def values(self, consumed_tokens: int, elapsed: float) -> dict[str, float]:
        """The interval's scalars (every rank must call: it all-reduces), then a reset."""
        total = self.sums.all_reduced()
        # an interval of skipped steps only has no loss to report: NaN (null in metrics.jsonl)
        replicas = total.value("replica_steps") or float("nan")
        steps = self.steps or float("nan")
        elapsed_steps = max(self.steps + self.skipped, 1)
        tokens_per_s = self.tokens / max(elapsed, 1e-9)
        tflops = self.flops_per_token * tokens_per_s / self.ranks.world_size / 1e12  # models/throughput.py
        values = {
            "train/lm_loss": total.value("lm_loss") / replicas,
            "train/mtp_lambda": self.lam,
            "train/lr": self.lr,
            "train/grad_norm": self.grad_norm_sum / steps,
            "perf/step_time_s": elapsed / elapsed_steps,
            "train/grad_norm_max": self.grad_norm_max if self.steps else float("nan"),
            "train/clipped_steps": float(self.clipped),
            "train/global_batch_size": float(self.global_batch),
            "perf/tokens_per_s": tokens_per_s,
            "perf/tokens_per_s_per_gpu": tokens_per_s / self.ranks.world_size,
            "perf/tflops_per_gpu": tflops,
            "perf/memory_gib": memory_gib(),
            **self.expert_load.interval_values(with_dropped=self.with_dropped),
            "moe/balance_loss": self._balance_loss(),
            **self._indexer_loss(),
            "progress/consumed_tokens": float(consumed_tokens),
            "train/skipped_steps": float(self.skipped),
            **self.extra,
        }
        if self.peak_tflops:  # a GPU of the plan's table (none on CPU: TFLOP/s only)
            values["perf/mfu"] = tflops / self.peak_tflops
        for k in range(1, self.depth + 1):
            judged = float(total["judged"][k - 1]) or float("nan")  # nothing measured: NaN, not 0
            values[f"train/mtp_loss_{k}"] = float(total["mtp_loss"][k - 1]) / replicas
            values[f"train/mtp_acceptance_{k}"] = float(total["accepted"][k - 1]) / judged
            values[f"train/mtp_accuracy_{k}"] = float(total["correct"][k - 1]) / judged
        self.reset()
        return values


def indexer_loss_values(totals: torch.Tensor, num_layers: int) -> dict[str, float]:
    """The DSA indexer KL loss scalars of an interval from its all-reduced [sum, count] per layer (the decoder's
    ``num_layers``, then the MTP layers'): per layer 'train/indexer_loss/layer_NN' (numbered from 1, MTP layers
    after the decoder's, as the MoE scalars are), and 'train/indexer_loss', the mean over the decoder layers
    that have an indexer. A layer with no count has none (IndexShare's layers that reuse another's top-k) or
    did not train in the interval, and is left out; nothing at all where no layer counted."""
    seen = totals[1] > 0
    if not bool(seen.any()):
        return {}
    per_layer = totals[0][seen] / totals[1][seen]
    indices = seen.nonzero().flatten().tolist()
    out = {f"train/indexer_loss/layer_{i + 1:02d}": float(v) for i, v in zip(indices, per_layer.tolist())}
    main = seen[:num_layers]
    if bool(main.any()):
        out = {"train/indexer_loss": float((totals[0][:num_layers][main] / totals[1][:num_layers][main]).mean()),
               **out}
    return out
