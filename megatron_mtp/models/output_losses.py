"""The output layer's per-token losses in chunks, for the GPTModels that compute their own losses (the
sequential MTP objective, models/mtp_objective.py, and the parallel heads): kernels.chunked_output_loss.

Design note. megatron-core's output layer is a column-parallel linear: its input, [s/TP, b, h] under
sequence parallelism or [s, b, h], goes through a region op (all-gather, or identity with an
all-reduce of its gradient) and each rank computes the logits of its vocabulary slice. Here the same
region op makes the input whole, and models/chunked_output_loss.py computes the loss from it and the
rank's weight slice, one chunk of tokens at a time. A loss [b, s] comes back, as megatron-core's
``compute_language_model_loss`` returns. No logits reach the output layer's forward hook, so the
acceptance metric (training/metrics.py) gets each call's argmax and cross entropy through
``prediction_observer`` instead, in the order the hook would have seen them (depths, then main).
"""

from __future__ import annotations

from typing import Optional

import torch

from megatron_mtp.models.chunked_output_loss import ChunkStats, chunked_output_loss


class ChunkedOutputLosses:
    """Mixin for a megatron-core GPTModel subclass (module note)."""

    output_chunk: Optional[int] = None
    """Tokens per chunk (kernels.output_loss_chunk) when the loss is chunked; None: the whole logits."""
    prediction_observer = None
    """training/metrics.py's MTPMetrics (wants_predictions, observe) on the stage with the loss."""

    def output_input(self, hidden: torch.Tensor) -> torch.Tensor:
        """The output layer's input, whole over the sequence: [s, b, h] (its region op, as the layer has it)."""
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel.mappings import (
            copy_to_tensor_model_parallel_region,
            gather_from_sequence_parallel_region,
        )

        group = parallel_state.get_tensor_model_parallel_group()
        if self.config.sequence_parallel:
            return gather_from_sequence_parallel_region(hidden, group=group)
        return copy_to_tensor_model_parallel_region(hidden, group=group)

    def chunked_token_losses(self, hidden: torch.Tensor, labels: torch.Tensor, output_weight=None,
                             teacher: Optional[torch.Tensor] = None, soft_weight: float = 0.0,
                             temperature: float = 1.0) -> torch.Tensor:
        """Per-token loss [b, s] of the whole-sequence ``hidden`` [s, b, h] (from ``output_input``) against
        ``labels`` [b, s] and, with ``soft_weight``, softmax(``teacher`` Wᵀ / T) ([s, b, h], detached)."""
        from megatron.core import parallel_state

        weight = output_weight if output_weight is not None else self.output_layer.weight
        s, b, h = hidden.shape
        observer = self.prediction_observer
        stats = ChunkStats() if observer is not None and observer.wants_predictions() else None
        loss = chunked_output_loss(
            hidden.reshape(s * b, h), weight, labels.t().reshape(-1),
            teacher.reshape(s * b, h) if teacher is not None else None, soft_weight=soft_weight,
            temperature=temperature, chunk=self.output_chunk, group=parallel_state.get_tensor_model_parallel_group(),
            first=parallel_state.get_tensor_model_parallel_rank() * weight.shape[0], stats=stats)
        if stats is not None:
            observer.observe(stats.argmax.view(s, b).t(), stats.token_ce.view(s, b).t())
        return loss.view(s, b).t()
