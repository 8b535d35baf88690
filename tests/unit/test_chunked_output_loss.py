"""models/chunked_output_loss.py at one process: the chunked loss and its gradients equal the loss of the
whole logits (token, self and mix targets; a chunk that does not divide the tokens), and only one chunk's
logits exist at a time. Over a vocabulary split between ranks: tests/dist/test_chunked_output_loss_tp.py."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.models.chunked_output_loss import chunked_output_loss

TOKENS, HIDDEN, VOCAB = 37, 16, 50


def reference(hidden, weight, labels, teacher, soft_weight, temperature):
    """The loss as today's path computes it: whole logits, then the cross entropies."""
    z = (hidden @ weight.t()).float()
    log_q = torch.log_softmax(z, -1)
    loss = torch.zeros(hidden.shape[0])
    if soft_weight < 1:
        loss = loss + (1 - soft_weight) * torch.nn.functional.cross_entropy(z, labels, reduction="none")
    if soft_weight:
        p = torch.softmax((teacher @ weight.detach().t()).float() / temperature, -1)  # a detached teacher
        loss = loss - soft_weight * (p * log_q).sum(-1)
    return loss


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(TOKENS, HIDDEN, generator=gen, dtype=torch.float64).float().requires_grad_()
    weight = (0.3 * torch.randn(VOCAB, HIDDEN, generator=gen)).requires_grad_()
    teacher = torch.randn(TOKENS, HIDDEN, generator=gen)
    labels = torch.randint(0, VOCAB, (TOKENS,), generator=gen)
    upstream = torch.rand(TOKENS, generator=gen)
    return hidden, weight, teacher, labels, upstream


@pytest.mark.parametrize("soft_weight", [0.0, 1.0, 0.3], ids=["tokens", "self", "mix"])
@pytest.mark.parametrize("chunk", [8, 37, 1000])
def test_loss_and_gradients_equal_the_whole_logits(soft_weight, chunk):
    hidden, weight, teacher, labels, upstream = _inputs()
    want = reference(hidden, weight, labels, teacher, soft_weight, 0.7)
    want_grads = torch.autograd.grad((want * upstream).sum(), (hidden, weight))
    got = chunked_output_loss(hidden, weight, labels, teacher, soft_weight=soft_weight, temperature=0.7, chunk=chunk)
    got_grads = torch.autograd.grad((got * upstream).sum(), (hidden, weight))
    assert torch.allclose(got, want, rtol=1e-6, atol=0), (got - want).abs().max()
    for g, w in zip(got_grads, want_grads):  # to 1e-5 of the gradient's largest element (fp32 reduction order)
        assert (g - w).abs().max() <= 1e-5 * w.abs().max(), (g - w).abs().max()


def test_only_one_chunk_of_logits_exists_at_a_time(monkeypatch):
    """Every logits tensor, in the forward and in the backward (which computes them again), is one chunk's,
    written into at most two chunk-sized buffers per pass; what the backward keeps is the inputs and one
    number per token, no [tokens × vocabulary] tensor."""
    import megatron_mtp.models.chunked_output_loss as module

    shapes, buffers = [], []
    made, allocate = module._logits, module._buffer
    monkeypatch.setattr(module, "_logits", lambda h, w, out: shapes.append(tuple(made(h, w, out).shape)) or
                        made(h, w, out))
    monkeypatch.setattr(module, "_buffer", lambda *a: buffers.append(tuple(allocate(*a).shape)) or allocate(*a))
    hidden, weight, teacher, labels, upstream = _inputs(1)
    loss = chunked_output_loss(hidden, weight, labels, teacher, soft_weight=0.3, chunk=8)
    forward, forward_buffers = len(shapes), len(buffers)
    saved = [tuple(t.shape) for t in loss.grad_fn.saved_tensors if t is not None]
    loss.backward(upstream)
    chunks = [(8, VOCAB)] * (TOKENS // 8) + [(TOKENS % 8, VOCAB)]
    assert shapes[:forward] == [s for c in chunks for s in (c, c)]  # student and teacher, chunk by chunk
    assert shapes[forward:] == shapes[:forward]
    assert buffers == [(8, VOCAB)] * 4 and forward_buffers == 2  # two in the forward, two in the backward
    assert sorted(saved) == sorted([(TOKENS, HIDDEN), (VOCAB, HIDDEN), (TOKENS,), (TOKENS, HIDDEN), (TOKENS,),
                                    (TOKENS,)])


def test_bad_arguments_are_refused():
    hidden, weight, teacher, labels, _ = _inputs()
    for kwargs, words in [({"soft_weight": 1.5}, "soft_weight"), ({"labels": None}, "labels"),
                          ({"soft_weight": 0.5, "teacher": None}, "teacher"), ({"chunk": 0}, "chunk")]:
        args = {"labels": labels, "teacher": teacher, **kwargs}
        with pytest.raises(ValueError, match=words):
            chunked_output_loss(hidden, weight, **args)


def test_statistics_equal_the_whole_logits():
    """The argmax and the cross entropy to the label the acceptance metric reads, taken chunk by chunk."""
    from megatron_mtp.models.chunked_output_loss import ChunkStats

    hidden, weight, teacher, labels, _ = _inputs(2)
    stats = ChunkStats()
    chunked_output_loss(hidden, weight, labels, teacher, soft_weight=1.0, chunk=8, stats=stats)
    z = (hidden @ weight.t()).float()
    assert torch.equal(stats.argmax, z.argmax(-1))
    want = torch.nn.functional.cross_entropy(z, labels, reduction="none")
    assert torch.allclose(stats.token_ce, want, rtol=1e-6, atol=0)
