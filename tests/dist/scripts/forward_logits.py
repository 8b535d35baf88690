"""Full-vocabulary logits of the main model and every MTP depth, at any parallel layout.

Used by the tests and tools/bench/bench_fp8_export.py to compare megatron-core's forward at one
layout with another and with exported models (usage in main()). Runs one forward-only pass through
megatron-core's schedule (so PP works), captures the output layer's D+1 calls on the last stage,
gathers vocab shards over TP, and returns them on the last stage's TP/DP rank 0 (None elsewhere).
"""

from __future__ import annotations

from typing import Optional

import torch


def forward_logits(session, tokens: torch.Tensor) -> Optional[dict]:
    """tokens [b, s] -> {"logits": [b, s, V], "mtp_logits": [D × [b, s, V]]} on one rank, else None."""
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    from megatron_mtp.training.batches import chunk_iterators
    from megatron_mtp.training.components import unwrap
    from megatron_mtp.training.forward_step import make_forward_step

    model = session.components.model
    gpt = unwrap(model[-1])  # the chunk with the output layer
    captured: list[torch.Tensor] = []
    handles = []
    if session.ranks.is_last_stage:
        def hook(module, inputs, output):
            logits = output[0] if isinstance(output, tuple) else output
            captured.append(gather_from_tensor_model_parallel_region(logits.detach().clone()).float())
        handles = [gpt.output_layer.register_forward_hook(hook)]
        if getattr(gpt, "mtp_assistant", None) is not None:  # an assistant's steps come first (mtp.style assistant)
            handles.append(gpt.mtp_assistant.output_layer.register_forward_hook(hook))
    b, s = tokens.shape
    tokens = tokens.to(session.platform.device)
    batch = {
        "tokens": tokens,
        "position_ids": torch.arange(s, device=tokens.device).expand(b, s).contiguous(),
        "labels": torch.zeros_like(tokens),
        "loss_mask": torch.ones(b, s, device=tokens.device),
    }

    for chunk in model:
        chunk.eval()
    try:
        with torch.no_grad():
            get_forward_backward_func()(
                forward_step_func=make_forward_step(None),
                data_iterator=chunk_iterators(lambda: iter([batch]), len(model)), model=model,
                num_microbatches=1, seq_length=s, micro_batch_size=b, forward_only=True,
            )
    finally:
        for handle in handles:
            handle.remove()
        for chunk in model:
            chunk.train()
    ranks = session.ranks
    if not (ranks.is_last_stage and ranks.tp_rank == 0 and parallel_state.get_data_parallel_rank() == 0):
        return None
    depth = session.cfg.mtp.num_layers
    as_bsv = [c.transpose(0, 1).contiguous() for c in captured]  # [s, b, V] -> [b, s, V]
    as_bsv = [t.cpu() for t in as_bsv]
    return {"logits": as_bsv[depth], "mtp_logits": as_bsv[:depth]}


def main(argv: Optional[list[str]] = None) -> int:
    """`forward_logits.py CKPT TOKENS.pt OUT.pt [key=value ...]` (any launcher).

    Loads CKPT at the layout given by the overrides (default TP1/PP1/EP1), runs forward_logits on
    the [b, s] LongTensor saved in TOKENS.pt and writes {"logits", "mtp_logits"} to OUT.pt.
    """
    import sys

    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.training.commands import _eval_config
    from megatron_mtp.training.distributed import destroy
    from megatron_mtp.training.session import open_checkpoint_for_eval

    args = list(sys.argv[1:] if argv is None else argv)
    ckpt_path, tokens_path, out_path, overrides = args[0], args[1], args[2], args[3:]
    ckpt = resolve_checkpoint(ckpt_path).path
    session = open_checkpoint_for_eval(ckpt, _eval_config(ckpt, overrides))
    try:
        result = forward_logits(session, torch.load(tokens_path))
        if result is not None:
            torch.save(result, out_path)
    finally:
        destroy()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
