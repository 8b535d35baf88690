"""Per-step training signals that megatron-core does not report by itself.

Design note: MTP draft acceptance, teacher-forced.
GPTModel calls its output layer D times for the MTP depths (depth 1 first) and then once for the
main model, all on the last pipeline stage. A forward hook on the output layer takes the argmax of
each call's vocab-parallel logits (max over the local vocab shard, then across TP ranks). For depth
k, the prediction at position t targets token t+1+k, which the main model predicts at position t+k:
    acceptance_k = mean_t [ argmax MTP_k(t) == argmax main(t+k) ]     (what greedy drafting accepts)
    accuracy_k   = mean_t [ argmax MTP_k(t) == label(t+k) ]           (top-1 against the data)
over positions t < s-k whose shifted loss mask is set. In evaluation the hook also computes the
per-depth cross entropy (megatron-core only records it in training mode). The argmax over the
vocabulary costs a few percent of a step on CPU, so training measures acceptance on the last step
of each logging interval (one global batch); evaluation measures every batch. The MoE layers'
signals are in moe_metrics.py.
With the chunked output loss (kernels.chunked_output_loss) no logits reach the output layer, so the
loss reports each call's argmax and cross entropy to the label itself, in the same order
(``observe``, reached through the model's ``prediction_observer``; models/output_losses.py): the same
argmax, tie rule included (the first vocabulary index wins over TP ranks).
"""

from __future__ import annotations

import torch

from megatron_mtp.models.soft_cross_entropy import argmax_over_shards
from megatron_mtp.platform import current as current_platform
from megatron_mtp.training.sums import NamedSums


class MTPMetrics:
    """Accumulates per-depth acceptance/accuracy (and eval CE) across micro-batches."""

    def __init__(self, depth: int, tp_group, cp_group=None):
        """cp_group: the context-parallel group, whose ranks hold chunks of each sequence; the targets k
        positions ahead are then rolled across them as the MTP labels are (models/context_parallel.py)."""
        self.depth = depth
        self.tp_group = tp_group
        self.cp_group = cp_group
        self.compute_ce = False
        self.active = True  # when False, micro-batches are not measured
        self._labels = None
        self._mask = None
        self._preds: list[torch.Tensor] = []
        self._logits_ce: list[torch.Tensor] = []
        self.reset()

    def reset(self) -> None:
        # per depth: drafts equal to the main model's argmax, drafts equal to the label, the summed
        # cross entropy (evaluation only) and the positions judged
        d = self.depth
        self.sums = NamedSums(accepted=d, correct=d, ce_sum=d, judged=d)

    def start_microbatch(self, labels: torch.Tensor, loss_mask: torch.Tensor) -> None:
        if not self.active:
            self._labels = None
            return
        self._labels = labels  # [b, s]
        self._mask = loss_mask
        self._preds = []

    def wants_predictions(self) -> bool:
        """Whether this micro-batch is measured (the chunked output loss asks before it takes argmaxes)."""
        return self._labels is not None and self.depth > 0

    def output_hook(self, module, inputs, output) -> None:
        if not self.wants_predictions():
            return
        logits = output[0] if isinstance(output, tuple) else output  # [s, b, V/tp]
        with torch.no_grad():
            pred = argmax_over_shards(logits, self.tp_group).t()  # [b, s]
            call, ce = len(self._preds), None
            if self.compute_ce and call < self.depth:
                from megatron.core.tensor_parallel import vocab_parallel_cross_entropy

                target = self._ahead(self._labels, call + 1).t().contiguous()  # [s, b]
                ce = vocab_parallel_cross_entropy(logits.float().clone(), target).t()  # [b, s]
            self.observe(pred, ce)

    def observe(self, pred: torch.Tensor, token_ce: torch.Tensor | None = None) -> None:
        """One output-layer call's argmax [b, s] and, for a depth, its cross entropy to the token k ahead
        [b, s] (only read in evaluation): depths 1..D first, then the main model's."""
        call = len(self._preds)
        if self.compute_ce and call < self.depth and token_ce is not None:
            self.sums["ce_sum"][call] += float((token_ce * self._valid_mask(call + 1)).sum())
        self._preds.append(pred)
        if call == self.depth:  # the main model's call: everything for this micro-batch is in
            self._accumulate(pred)

    def _ahead(self, tensor: torch.Tensor, k: int) -> torch.Tensor:
        """[b, s] -> the value k positions later at each position, 0 past the sequence's end (across the
        context-parallel ranks with megatron-core's roll_tensor, as the MTP labels are rolled)."""
        if self.cp_group is None:
            out = torch.zeros_like(tensor)
            out[:, : tensor.shape[1] - k] = tensor[:, k:]
            return out
        from megatron.core.transformer.multi_token_prediction import roll_tensor

        for _ in range(k):
            tensor, _ = roll_tensor(tensor, shifts=-1, dims=-1, cp_group=self.cp_group)
        return tensor

    def _valid_mask(self, k: int) -> torch.Tensor:
        return self._ahead(self._mask.float(), k)

    def _accumulate(self, main_pred: torch.Tensor) -> None:
        for i in range(self.depth):
            k = i + 1
            draft, mask = self._preds[i], self._valid_mask(k)
            self.sums["accepted"][i] += float(((draft == self._ahead(main_pred, k)).float() * mask).sum())
            self.sums["correct"][i] += float(((draft == self._ahead(self._labels, k)).float() * mask).sum())
            self.sums["judged"][i] += float(mask.sum())
        self._labels = None


def memory_gib() -> float:
    """Peak accelerator memory on GPU, resident set size on CPU (GiB)."""
    if current_platform().is_cpu:
        import psutil

        return psutil.Process().memory_info().rss / 2**30
    return torch.cuda.max_memory_allocated() / 2**30
