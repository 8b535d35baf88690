"""The assumptions a memory plan (plan/memory.py) rests on, one sentence each, as its report prints them."""

from __future__ import annotations

from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.platform.gpus import FIXED_ALLOWANCE, GIB


def assumptions(plan) -> list[str]:
    """``plan``: a plan/memory.py Plan."""
    cfg, s, k = plan.cfg, plan.sizes, plan.target.kernels
    t, o = cfg.training, cfg.optimizer
    where = "CPU (local specs, gloo)" if plan.target.platform.is_cpu else \
        f"{plan.gpu.name} ({plan.gpu.memory_bytes / GIB:.1f} GiB), Transformer Engine specs"
    out = [
        f"target: {where}; world {s.world} = TP{s.tp} × PP{s.pp}" + (f" (VPP{s.vpp})" if s.vpp > 1 else "") +
        (f" × CP{s.cp}" if s.cp > 1 else "") +
        f" × DP{s.dp}; experts EP{s.ep} × ETP{s.etp} × EDP{s.edp}",
        f"{plan.num_micro} micro-batches of {t.micro_batch_size} × {t.seq_length} tokens per step per data-parallel "
        "rank (global batch / (micro batch × DP))",
        "parameters, gradients and optimizer state: megatron-core 0.16.1 DDP buffers (64-element parameter "
        "alignment, buckets padded to lcm(DP, 128)) and the " +
        ("distributed optimizer's shard of each bucket on the worst data-parallel rank" if cfg.parallel.
         distributed_optimizer else "unsharded optimizer"),
        f"{t.precision} parameters, {'fp32' if t.precision == 'fp32' or t.grad_reduce_dtype == 'fp32' else 'bf16'} "
        "gradients, " + ("fp32 main parameters, " if t.precision != "fp32" else "") +
        f"{'bf16' if o.precision_aware and o.moment_dtype == 'bf16' else 'fp32'} Adam moments" +
        (f", {o.offload_fraction:.0%} of optimizer state offloaded to host memory" if o.offload_fraction else ""),
        f"attention kernel {k.attention}, RMSNorm {k.norm}, SwiGLU {k.swiglu}, RoPE {k.rope}, cross entropy " +
        (f"chunked output loss ({k.output_chunk} tokens a chunk, no logits kept)" if k.output_chunk else
         f"{k.cross_entropy or 'unfused (fp32 softmax kept)'}") + (", FP8 linear inputs (1 byte)" if k.fp8 else ""),
        "activations: tensors saved for backward per layer (plan/activations.py), times the micro-batches "
        "megatron-core's " + ("interleaved" if s.vpp > 1 else "1F1B" if s.pp > 1 else "") +
        " schedule keeps in flight at its peak",
        f"routing: each expert-parallel rank receives {plan.imbalance:g}× the balanced token count "
        + ("(--routing-imbalance)" if cfg.model.moe_capacity_factor is None else
           "(model.moe_capacity_factor " + ("pads every expert to it" if cfg.model.moe_pad_to_capacity else
                                            "caps --routing-imbalance") + ")"),
    ]
    if t.fp8 is not None and not plan.target.platform.is_cpu:
        out.append("FP8 weights: " + ("parameters stored in FP8 (1 byte) plus a column-wise FP8 copy (1 byte)"
                                      if t.fp8_param_gather else
                                      "row- and column-wise FP8 copies (2 bytes) of every linear weight kept per step"))
    if s.pp > 1:
        out.append("pipeline: each in-flight chunk output is kept until its backward (on CPU)"
                   if plan.target.platform.is_cpu else
                   "pipeline: a chunk's output is freed once sent (deallocate_pipeline_outputs); only its autograd "
                   "node waits for the backward")
    said = get_style(cfg.mtp.style).plan().assumption(cfg) if cfg.mtp.num_layers else None
    if said:
        out.append(said)
    if cfg.mtp.freeze_base:
        out.append("mtp.freeze_base: only the MTP modules take gradients and optimizer state and sit in DDP "
                   "buffers; the main model runs forward only (no saved activations), so each rank holds the "
                   "MTP graph of one micro-batch at most")
    if hasattr(cfg.model, "index_topk"):  # the DSA families (models/dsa/activations.py)
        out.append("DeepSeek Sparse Attention: megatron-core's unfused PyTorch path (dsa_kernel_backend none, the "
                   "one wired) keeps three fp32 [batch, heads, seq, seq] score tensors per layer and the top-k as a "
                   "mask; the indexer keeps its tensors only where it learns (model.indexer_loss_coeff > 0)")
    if cfg.parallel.token_dispatcher == "flex":
        out.append("token dispatcher flex: planned as alltoall (same tokens per rank; DeepEP's own buffers are in "
                   "the workspace allowance)")
    if not plan.target.platform.is_cpu:
        out.append(f"workspace: the largest transient (a recomputed layer, logits, dispatch buffers) + "
                   f"{FIXED_ALLOWANCE / GIB:.0f} GiB for CUDA context, NCCL, library workspaces and fragmentation")
    return out
