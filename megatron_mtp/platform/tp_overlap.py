"""Transformer Engine userbuffers for tensor-parallel communication overlap (GPU only).

With parallel.tp_comm_overlap on, TE's linear layers overlap their TP all-gather/reduce-scatter
with the GEMM through userbuffers that must exist before the model is built, sized for one
micro-batch's activations: [seq_length × micro_batch_size, hidden_size] (what Megatron-LM passes).
"""

from __future__ import annotations


def initialize_userbuffers(cfg) -> None:
    import torch
    from transformer_engine.pytorch.module import base as te_base

    t = cfg.training
    te_base.initialize_ub(
        shape=[t.seq_length * t.micro_batch_size, cfg.model.hidden_size],
        tp_size=cfg.parallel.tensor,
        use_fp8=t.fp8 is not None,
        dtype=torch.bfloat16 if t.precision == "bf16" else torch.float16 if t.precision == "fp16" else torch.float32,
    )
