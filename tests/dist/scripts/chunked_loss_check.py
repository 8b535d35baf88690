"""On the ranks of a tensor-parallel group (sys.argv[2]=sp: sequence parallel), the chunked output-layer loss
against the whole logits of the full vocabulary: prints one JSON line of the largest relative errors, and
whether the argmaxes it reports for the acceptance metric equal the full vocabulary's."""

from __future__ import annotations

import json
import os
import sys


def main(config: str, mode: str) -> None:
    import torch
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel.mappings import (
        copy_to_tensor_model_parallel_region,
        gather_from_sequence_parallel_region,
    )

    from megatron_mtp.config import load_config
    from megatron_mtp.models.chunked_output_loss import ChunkStats, chunked_output_loss
    from megatron_mtp.platform import setup
    from megatron_mtp.training.distributed import destroy, init_distributed

    world = int(os.environ.get("WORLD_SIZE", "1"))
    cfg = load_config(config, [f"parallel.tensor={world}"])
    init_distributed(cfg, setup("cpu"))
    try:
        tp = parallel_state.get_tensor_model_parallel_world_size()
        rank = parallel_state.get_tensor_model_parallel_rank()
        group = parallel_state.get_tensor_model_parallel_group()
        seq, batch, hidden_size, vocab = 24, 2, 16, 64
        gen = torch.Generator().manual_seed(0)  # the same full tensors on every rank
        hidden = torch.randn(seq, batch, hidden_size, generator=gen)
        weight = 0.3 * torch.randn(vocab, hidden_size, generator=gen)
        teacher = torch.randn(seq, batch, hidden_size, generator=gen)
        labels = torch.randint(0, vocab, (seq, batch), generator=gen)
        upstream = torch.rand(seq, batch, generator=gen)
        part = vocab // tp
        errors, argmax_equal = {}, {}
        for name, soft_weight in (("tokens", 0.0), ("self", 1.0), ("mix", 0.3)):
            # the whole logits of the full vocabulary, as today's path
            h_ref, w_ref = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
            z = h_ref @ w_ref.t()
            want = (1 - soft_weight) * torch.nn.functional.cross_entropy(
                z.reshape(-1, vocab), labels.reshape(-1), reduction="none").reshape(seq, batch)
            p = torch.softmax(teacher @ weight.t(), -1)
            want = want - soft_weight * (p * torch.log_softmax(z, -1)).sum(-1)
            (want * upstream).sum().backward()
            # this rank: its vocabulary slice; the hidden state through megatron-core's region op
            w = weight[rank * part:(rank + 1) * part].clone().requires_grad_()
            if mode == "sp":
                rows = seq // tp
                h_local = hidden[rank * rows:(rank + 1) * rows].clone().requires_grad_()
                h = gather_from_sequence_parallel_region(h_local, group=group)
            else:
                h_local = hidden.clone().requires_grad_()
                h = copy_to_tensor_model_parallel_region(h_local, group=group)
            stats = ChunkStats()
            got = chunked_output_loss(h.reshape(-1, hidden_size), w, labels.reshape(-1),
                                      teacher.reshape(-1, hidden_size), soft_weight=soft_weight, chunk=7,
                                      group=group, first=rank * part, stats=stats).reshape(seq, batch)
            argmax_equal[name] = bool(torch.equal(stats.argmax.view(seq, batch), z.detach().argmax(-1)))
            (got * upstream).sum().backward()
            grad_h_ref = h_ref.grad[rank * (seq // tp):(rank + 1) * (seq // tp)] if mode == "sp" else h_ref.grad
            grad_w_ref = w_ref.grad[rank * part:(rank + 1) * part]
            errors[name] = {
                "loss": float(((got - want).abs() / want.abs()).max()),
                "grad_hidden": float((h_local.grad - grad_h_ref).abs().max() / grad_h_ref.abs().max()),
                "grad_weight": float((w.grad - grad_w_ref).abs().max() / grad_w_ref.abs().max()),
            }
    finally:
        destroy()
    if rank == 0:
        print(json.dumps({"tp": tp, "errors": errors, "argmax_equal": argmax_equal}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
