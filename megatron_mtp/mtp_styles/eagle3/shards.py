"""The EAGLE-3 drafter under tensor parallelism: what it reads of the target's sharded tensors.

Design note. The drafter's linears are megatron-core's ColumnParallel/RowParallel ones (layer.py, drafter.py), so
it runs in the target's layout as a TransformerLayer does: under sequence parallelism its residual stream is
sequence-sharded [s/tp, b, h] like the target's aux hidden states it reads, each column-parallel linear gathers the
sequence, the attention runs over its rank's heads on the whole sequence, and the row-parallel ones reduce-scatter
it back. ``fc`` (column-parallel, its output gathered) and ``lm_head`` (column-parallel, gathered) leave whole
tensors: ``fc``'s is split to this rank's sequence chunk, ``lm_head``'s logits over the draft vocabulary are whole
on every TP rank, so the KL (model.py) is the same on each, as megatron-core's vocab-parallel cross entropy is.

Two things come from vocab-sharded tensors of the target, both by a sum over TP of each rank's own columns (every
draft id lives on exactly one rank), never by gathering the whole vocabulary: the teacher, the target's logits at
the draft ids [s, b, draft vocab] (``draft_columns``), and a new drafter's head, the target's output rows at them
(``draft_rows``). The token embeddings a step reads are looked up in the target's vocab-parallel table, which
under sequence parallelism leaves them reduce-scattered over the sequence already (``sequence_local``).
"""

from __future__ import annotations

import torch


def _tp():
    from megatron.core import parallel_state

    return (parallel_state.get_tensor_model_parallel_world_size(), parallel_state.get_tensor_model_parallel_rank(),
            parallel_state.get_tensor_model_parallel_group())


def _summed(local: torch.Tensor, ids: torch.Tensor, first: int, dim: int, shape: tuple, group) -> torch.Tensor:
    """The entries of ``ids`` along ``dim`` of the vocab shard ``local`` (ids first..first + rows), zero where
    another rank holds them, summed over TP: each id's entry from the rank that has it."""
    rows = local.shape[dim]
    own = (ids >= first) & (ids < first + rows)
    out = local.new_zeros(shape)
    index = [slice(None)] * local.dim()
    index[dim] = own
    source = [slice(None)] * local.dim()
    source[dim] = ids[own] - first
    out[tuple(index)] = local[tuple(source)]
    torch.distributed.all_reduce(out, group=group)
    return out


def draft_columns(logits: torch.Tensor, ids: torch.Tensor, vocab: int) -> torch.Tensor:
    """The target's logits [s, b, V or V/tp] at the draft ``ids``: [s, b, len(ids)], detached (``vocab``: the
    whole padded vocabulary, to tell gathered logits from a shard)."""
    logits = logits.detach()
    size, rank, group = _tp()
    if size == 1 or logits.shape[-1] == vocab:
        return logits[..., ids]
    return _summed(logits, ids, rank * logits.shape[-1], -1, (*logits.shape[:-1], ids.numel()), group)


def draft_rows(weight: torch.Tensor, ids: torch.Tensor, rows: int) -> torch.Tensor:
    """This rank's ``rows`` rows of the target's output rows at the draft ``ids`` (a column-parallel head's shard),
    from its vocab-sharded output ``weight`` [V/tp, h]."""
    size, rank, group = _tp()
    if size == 1:
        return weight[ids]
    whole = _summed(weight.detach(), ids, rank * weight.shape[0], 0, (ids.numel(), weight.shape[1]), group)
    return whole[rank * rows:(rank + 1) * rows]


def sequence_local(embedded: torch.Tensor, word_embeddings, sequence_parallel: bool) -> torch.Tensor:
    """[s(/tp), b, h] token embeddings in the drafter's layout from the vocab-parallel table's output: [s/tp, b, h]
    already when the table reduce-scatters it (sequence parallelism), else [b, s, h], split to this rank's
    sequence chunk under sequence parallelism."""
    if getattr(word_embeddings, "reduce_scatter_embeddings", False):
        return embedded
    embedded = embedded.transpose(0, 1)
    if not sequence_parallel:
        return embedded
    from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

    return scatter_to_sequence_parallel_region(embedded)


def sequence_split(hidden: torch.Tensor, sequence_parallel: bool) -> torch.Tensor:
    """A whole [s, b, h] tensor (``fc``'s gathered output) as this rank's sequence chunk under sequence
    parallelism; the gradient is gathered back."""
    if not sequence_parallel:
        return hidden
    from megatron.core.tensor_parallel import scatter_to_sequence_parallel_region

    return scatter_to_sequence_parallel_region(hidden)
