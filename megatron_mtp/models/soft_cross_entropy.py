"""Cross-entropy of a student's logits to a teacher's distribution, with the vocabulary split over
tensor-parallel ranks (megatron-core's output layer keeps each rank's slice of the logits).

Design note. Per token, CE(p, q) = -Σ_v p_v log q_v = logsumexp(z) - Σ_v p_v z_v with q = softmax(z),
p = softmax(t / T). Each of logsumexp(z), logsumexp(t / T) and Σ p_v z_v is a max or a sum over the
vocabulary, so three small all-reduces over the tensor-parallel group (the max, then the sums of
exponentials and of p·z) give every rank the full per-token value; no rank ever holds the whole
vocabulary. The gradient with respect to the student's slice is q_v - p_v on that slice (the teacher
is a constant), saved from the forward, so the backward needs no communication.
"""

from __future__ import annotations

import torch


def vocab_all_reduce(x: torch.Tensor, group, op) -> torch.Tensor:
    """All-reduce over the ranks the vocabulary is split over (nothing to do without such a group)."""
    if group is not None and torch.distributed.is_initialized() and torch.distributed.get_world_size(group) > 1:
        torch.distributed.all_reduce(x, op=op, group=group)
    return x


def vocab_exp_sum(x: torch.Tensor, out: torch.Tensor, group) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """exp(x − peak) written into ``out`` (which may be x itself), the peak (the largest entry of the last
    dimension over the whole vocabulary, split over `group`) and the sum of the exponentials, all but the
    last dimension's shape: the log-sum-exp is peak + log(sum)."""
    peak = vocab_all_reduce(x.amax(dim=-1), group, torch.distributed.ReduceOp.MAX)
    e = torch.sub(x, peak.unsqueeze(-1), out=out).exp_()
    return e, peak, vocab_all_reduce(e.sum(dim=-1), group, torch.distributed.ReduceOp.SUM)


def vocab_logsumexp(x: torch.Tensor, group) -> torch.Tensor:
    """logsumexp over the last dimension of a vocabulary split over `group` (kept, of size 1)."""
    _, peak, total = vocab_exp_sum(x, torch.empty_like(x), group)
    return (peak + torch.log(total)).unsqueeze(-1)


def vocab_parallel_argmax(local_max: torch.Tensor, global_index: torch.Tensor, group) -> torch.Tensor:
    """The global argmax from each rank's best logit over its vocabulary slice (``local_max``) and that
    entry's global index; the first rank wins ties, like an argmax over the whole vocabulary."""
    world = torch.distributed.get_world_size(group) if group is not None and torch.distributed.is_initialized() else 1
    if world == 1:
        return global_index
    maxes = [torch.empty_like(local_max) for _ in range(world)]
    indices = [torch.empty_like(global_index) for _ in range(world)]
    torch.distributed.all_gather(maxes, local_max.contiguous(), group=group)
    torch.distributed.all_gather(indices, global_index.contiguous(), group=group)
    best = torch.stack(maxes).argmax(dim=0)
    return torch.stack(indices).gather(0, best.unsqueeze(0)).squeeze(0)


class _SoftCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, student, teacher, temperature, group):
        z = student.float()
        t = teacher.detach().float() / temperature
        lse_z = vocab_logsumexp(z, group)
        p = torch.exp(t - vocab_logsumexp(t, group))
        pz = vocab_all_reduce((p * z).sum(dim=-1, keepdim=True), group, torch.distributed.ReduceOp.SUM)
        # one saved tensor, q - p; none of the inputs (megatron-core's CE later works in place on logits)
        ctx.save_for_backward(torch.exp(z - lse_z) - p)
        ctx.student_dtype = student.dtype
        return (lse_z - pz).squeeze(-1)

    @staticmethod
    def backward(ctx, grad):
        (q_minus_p,) = ctx.saved_tensors
        return (q_minus_p * grad.unsqueeze(-1)).to(ctx.student_dtype), None, None, None


def vocab_parallel_soft_cross_entropy(student: torch.Tensor, teacher: torch.Tensor, temperature: float = 1.0,
                                      group=None) -> torch.Tensor:
    """Per-token CE(softmax(teacher / T), softmax(student)) over the last dimension, which each rank of
    `group` holds a slice of (None: the whole vocabulary here). Only `student` gets a gradient."""
    return _SoftCrossEntropy.apply(student, teacher, float(temperature), group)


def argmax_over_shards(logits: torch.Tensor, tp_group) -> torch.Tensor:
    """The global argmax of logits whose last dimension is split over the tensor-parallel ranks
    ([..., V/TP] -> [...]; the first vocabulary index wins ties)."""
    local_max, local_idx = logits.float().max(dim=-1)
    if tp_group is None or torch.distributed.get_world_size(tp_group) == 1:
        return local_idx
    return vocab_parallel_argmax(local_max, local_idx + torch.distributed.get_rank(tp_group) * logits.shape[-1],
                                 tp_group)
