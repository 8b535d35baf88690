"""The output layer and its cross entropy over chunks of tokens: per-token losses without the logits.

Design note. The output layer's logits, z = h Wᵀ, are the largest activation of a language model
([tokens, V/TP] in fp32 for the loss), and MTP computes them once per depth. Here the projection and
the cross entropy run ``chunk`` tokens at a time, so only one chunk's logits exist, in the forward
and in the backward alike:
- forward, per chunk: z_c = h_c Wᵀ (in h's dtype, then fp32, as megatron-core's output layer and
  cross entropy do), logsumexp(z_c) and the target terms; only the per-token logsumexp is kept;
- backward, per chunk: z_c is computed again from the saved h_c, and with q = exp(z - lse) the
  logit gradient is g·(q − target distribution); dh_c = dz_c W and dW += dz_cᵀ h_c.
Every chunk writes into the same one or two fp32 buffers of [chunk, V/TP] (logits, and the exponentials
or the teacher's logits), in place: no chunk-sized tensor is allocated per chunk, which on CPU would
pay its page faults every time.
The vocabulary is split over tensor-parallel ranks as in megatron-core's vocab-parallel cross
entropy: each rank holds W's rows [first, first + V/TP), and the max, the sum of exponentials and the
target logit (or Σ p·z) are all-reduced over the group per chunk. dh is this rank's share; the caller
feeds h through megatron-core's region op (identity forward, all-reduce or reduce-scatter backward),
as the output layer does.

Targets, per token, weight w of the soft part (``tokens``: 0, ``self``: 1, ``mix``: mtp.self_weight):
  loss = (1 − w)·CE(onehot(label), q) + w·CE(p, q),  p = softmax(t / T),  t = h_teacher Wᵀ (detached),
and CE(p, q) = lse(z) − Σ p·z. The teacher's logits are recomputed per chunk from its hidden state
(the main model's, rolled to the depth's position), never stored.

Statistics. Given a ``ChunkStats``, the forward also keeps each token's argmax over the vocabulary
(per chunk the slice's best logit and its index, resolved over TP once at the end) and its cross
entropy to the label, lse(z) − z_label: what the acceptance metric reads from the whole logits
otherwise (training/metrics.py). Both are outside autograd.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from megatron_mtp.models.soft_cross_entropy import vocab_all_reduce, vocab_exp_sum, vocab_parallel_argmax

SUM = torch.distributed.ReduceOp.SUM


def _chunks(tokens: int, chunk: int):
    for start in range(0, tokens, chunk):
        yield slice(start, min(start + chunk, tokens))


def _logits(h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """z = h Wᵀ into the first rows of ``out`` (fp32): computed in fp32, or in h's dtype and then cast, as
    megatron-core's output layer and its cross entropy do."""
    z = out[:h.shape[0]]
    if h.dtype == torch.float32 and weight.dtype == torch.float32:
        return torch.mm(h, weight.t(), out=z)
    return z.copy_(h @ weight.t())


def _teacher_logits(h: torch.Tensor, weight: torch.Tensor, out: torch.Tensor, temperature: float) -> torch.Tensor:
    """t / T, the teacher's tempered logits, into ``out`` (``_logits``), the same in forward and backward."""
    t = _logits(h, weight, out)
    return t.div_(temperature) if temperature != 1 else t


def _local_labels(labels: torch.Tensor, first: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each label's column in this rank's vocabulary slice (clamped into it) and whether the slice holds it."""
    local = labels - first
    return local.clamp(0, width - 1), (local >= 0) & (local < width)


def _target_logit(z: torch.Tensor, labels: torch.Tensor, first: int, group) -> torch.Tensor:
    """z at each token's label, from the rank whose vocabulary slice holds it."""
    local, here = _local_labels(labels, first, z.shape[-1])
    picked = torch.gather(z, -1, local.unsqueeze(-1)).squeeze(-1) * here
    return vocab_all_reduce(picked, group, SUM)


@dataclass
class ChunkStats:
    """What the forward found besides the loss, per token [N] (module note)."""

    argmax: Optional[torch.Tensor] = None
    """The global vocabulary index of each token's largest logit."""
    token_ce: Optional[torch.Tensor] = None
    """The cross entropy to each token's label."""


class _ChunkedOutputLoss(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, teacher, soft_weight, temperature, chunk, group, first, stats):
        n = hidden.shape[0]
        f32 = dict(dtype=torch.float32, device=hidden.device)
        if stats is not None:
            best, best_index = torch.empty(n, **f32), torch.empty(n, dtype=torch.long, device=hidden.device)
            stats.token_ce = torch.empty(n, **f32)
        loss, lse_z = torch.empty(n, **f32), torch.empty(n, **f32)
        lse_t = torch.empty(n, **f32) if soft_weight else None
        logits, work = _buffer(n, chunk, weight), _buffer(n, chunk, weight)
        with torch.no_grad():
            for c in _chunks(n, chunk):
                z = _logits(hidden[c], weight, logits)
                if stats is not None:
                    torch.max(z, dim=-1, out=(best[c], best_index[c]))
                _, peak, total = vocab_exp_sum(z, work[:z.shape[0]], group)
                lse = lse_z[c] = peak + torch.log(total)
                value = torch.zeros_like(lse)
                if soft_weight < 1 or stats is not None:
                    token_ce = lse - _target_logit(z, labels[c], first, group)
                    if soft_weight < 1:
                        value += (1 - soft_weight) * token_ce
                    if stats is not None:
                        stats.token_ce[c] = token_ce
                if soft_weight:  # the teacher's logits in the spare buffer, then its probabilities in place
                    t = _teacher_logits(teacher[c], weight, work, temperature)
                    p, peak_t, total_t = vocab_exp_sum(t, t, group)
                    lse_t[c] = peak_t + torch.log(total_t)
                    pz = vocab_all_reduce(p.mul_(z).sum(dim=-1), group, SUM) / total_t
                    value += soft_weight * (lse - pz)
                loss[c] = value
            if stats is not None:
                stats.argmax = vocab_parallel_argmax(best, best_index + first, group)
        ctx.save_for_backward(hidden, weight, labels, teacher, lse_z, lse_t)
        ctx.setup = (soft_weight, temperature, chunk, first)
        return loss

    @staticmethod
    def backward(ctx, grad):
        hidden, weight, labels, teacher, lse_z, lse_t = ctx.saved_tensors
        soft_weight, temperature, chunk, first = ctx.setup
        n = hidden.shape[0]
        grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) \
            if ctx.needs_input_grad[1] else None
        logits = _buffer(n, chunk, weight)
        teacher_logits = _buffer(n, chunk, weight) if soft_weight else None
        for c in _chunks(n, chunk):
            dz = _logits(hidden[c], weight, logits).sub_(lse_z[c].unsqueeze(-1)).exp_()  # q, in place
            if soft_weight < 1:
                local, here = _local_labels(labels[c], first, dz.shape[-1])
                rows = torch.nonzero(here).squeeze(-1)
                dz[rows, local[rows]] -= 1 - soft_weight
            if soft_weight:
                t = _teacher_logits(teacher[c], weight, teacher_logits, temperature)
                dz.add_(t.sub_(lse_t[c].unsqueeze(-1)).exp_(), alpha=-soft_weight)
            dz.mul_(grad[c].unsqueeze(-1))
            if dz.dtype != hidden.dtype:
                dz = dz.to(hidden.dtype)
            if grad_hidden is not None:
                torch.mm(dz, weight, out=grad_hidden[c])
            if grad_weight is not None and dz.dtype == torch.float32:
                grad_weight.addmm_(dz.t(), hidden[c])
            elif grad_weight is not None:
                grad_weight += (dz.t() @ hidden[c]).float()
        if grad_weight is not None:
            grad_weight = grad_weight.to(weight.dtype)
        return grad_hidden, grad_weight, None, None, None, None, None, None, None, None


def _buffer(tokens: int, chunk: int, weight: torch.Tensor) -> torch.Tensor:
    """An fp32 buffer for one chunk's logits over this rank's vocabulary slice, reused by every chunk:
    with at most two of them, the module's only tensors of that size (no allocation per chunk)."""
    return torch.empty((min(chunk, tokens), weight.shape[0]), dtype=torch.float32, device=weight.device)


def chunked_output_loss(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor | None = None,
                        teacher: torch.Tensor | None = None, soft_weight: float = 0.0, temperature: float = 1.0,
                        chunk: int = 1024, group=None, first: int = 0,
                        stats: Optional[ChunkStats] = None) -> torch.Tensor:
    """Per-token loss [N] of ``hidden`` [N, h] through the output weight slice [V/TP, h] whose first row is
    vocabulary entry ``first``: (1 − soft_weight)·CE to ``labels`` [N] plus soft_weight·CE to
    softmax(``teacher`` Wᵀ / T) (``teacher`` [N, h], detached), ``chunk`` tokens at a time (module note).
    Gradients reach ``hidden`` (this rank's share) and ``weight``. ``stats``: filled with each token's argmax
    and cross entropy to its label (module note)."""
    if not 0.0 <= soft_weight <= 1.0:
        raise ValueError(f"soft_weight must be in [0, 1], got {soft_weight}")
    if soft_weight < 1 and labels is None:
        raise ValueError("labels are needed unless the loss is wholly soft (soft_weight 1)")
    if soft_weight and teacher is None:
        raise ValueError("a teacher hidden state is needed for a soft loss")
    if chunk < 1:
        raise ValueError(f"chunk must be at least 1 token, got {chunk}")
    if labels is None:
        labels = torch.zeros(hidden.shape[0], dtype=torch.long, device=hidden.device)
    teacher = teacher.detach() if teacher is not None else hidden.new_empty(0)
    return _ChunkedOutputLoss.apply(hidden, weight, labels.long(), teacher, float(soft_weight), float(temperature),
                                    int(chunk), group, int(first), stats)
