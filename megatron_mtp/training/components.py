"""Build everything a rank trains with: model chunk(s) in megatron DDP, optimizer, LR scheduler.

A pipeline rank holds one model chunk, or `vpp` chunks with the interleaved schedule (chunk v of
rank r is stage v × PP + r of the layout). Each chunk is a GPTModel wrapped in megatron-core's DDP;
the distributed optimizer and the schedules take the list.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from megatron_mtp.config import Config
from megatron_mtp.models.family import get_family
from megatron_mtp.models.initialization import initialize_layout_invariant
from megatron_mtp.models.tensor_table import mtp_key_prefixes
from megatron_mtp.platform import Platform
from megatron_mtp.platform.features import Features, resolve_features
from megatron_mtp.platform.optimizers import use_fused_torch_adam, use_optimizers
from megatron_mtp.training.schedules import build_lr_scheduler, mtp_lambda

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass
class TrainState:
    """Everything restored on resume besides tensors."""

    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0


@dataclass
class Components:
    config: Any  # megatron TransformerConfig (shared by every module: λ is updated here)
    model: list  # model chunks (one per virtual stage), DDP-wrapped
    optimizer: Any
    scheduler: Any
    vocab_size: int
    features: Features

    @property
    def overlaps_param_gather(self) -> bool:
        """The distributed optimizer gathers parameters lazily in the next forward (pre-hooks)."""
        return bool(self.model and self.model[0].ddp_config.overlap_param_gather
                    and self.model[0].ddp_config.use_distributed_optimizer)

    def sync_params(self) -> None:
        """Finish every pending parameter all-gather, so the modules hold the optimizer's latest
        weights (before a save; a no-op without overlap_param_gather). Without it, the slices other
        data-parallel ranks own would be saved one step stale."""
        if self.overlaps_param_gather:
            for chunk in self.model:
                chunk.start_param_sync(force_sync=True)

    @contextlib.contextmanager
    def params_in_sync(self) -> Iterator[None]:
        """The modules hold the latest weights for the whole block, with no lazy gathers (evaluation)."""
        if not self.overlaps_param_gather:
            yield
            return
        for chunk in self.model:
            chunk.disable_forward_pre_hook(param_sync=True)
        try:
            yield
        finally:
            for chunk in self.model:
                chunk.enable_forward_pre_hook()


def ddp_config(cfg: Config, features: Features):
    from megatron.core.distributed import DistributedDataParallelConfig

    p, t = cfg.parallel, cfg.training
    overlap = not cfg.mtp.freeze_base  # frozen base: MTP gradients are reduced once, after the last micro-batch
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=t.grad_reduce_dtype == "fp32",
        overlap_grad_reduce=p.overlap_grad_reduce and overlap,
        overlap_param_gather=p.overlap_param_gather and overlap,
        align_param_gather=p.overlap_param_gather and overlap,
        bucket_size=p.bucket_size,
        use_distributed_optimizer=p.distributed_optimizer,
        fp8_param_gather=t.fp8_param_gather,
    )


def optimizer_config(cfg: Config):
    from megatron.core.optimizer import OptimizerConfig

    return OptimizerConfig(**optimizer_config_kwargs(cfg))


def optimizer_config_kwargs(cfg: Config) -> dict:
    """megatron-core OptimizerConfig fields of this run."""
    o, t = cfg.optimizer, cfg.training
    moments = DTYPES[o.moment_dtype]
    return dict(
        optimizer="adam",
        lr=o.lr,
        min_lr=o.min_lr,
        weight_decay=o.weight_decay,
        adam_beta1=o.adam_beta1,
        adam_beta2=o.adam_beta2,
        adam_eps=o.adam_eps,
        clip_grad=o.clip_grad,
        bf16=t.precision == "bf16",
        fp16=t.precision == "fp16",
        params_dtype=DTYPES[t.precision],
        use_distributed_optimizer=cfg.parallel.distributed_optimizer,
        use_precision_aware_optimizer=o.precision_aware,
        main_grads_dtype=DTYPES[t.grad_reduce_dtype] if o.precision_aware else torch.float32,
        exp_avg_dtype=moments,
        exp_avg_sq_dtype=moments,
        optimizer_cpu_offload=o.offload_fraction > 0,
        optimizer_offload_fraction=o.offload_fraction,
        overlap_cpu_optimizer_d2h_h2d=o.offload_overlap,
    )


def build_components(cfg: Config, platform: Platform, vocab_size: int, with_optimizer: bool = True) -> Components:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import get_megatron_optimizer

    features = resolve_features(cfg, platform)
    if features.tp_comm_overlap:
        from megatron_mtp.platform.tp_overlap import initialize_userbuffers

        initialize_userbuffers(cfg)
    family = get_family(cfg.model.family)
    tconfig = family.build_transformer_config(cfg, platform, mtp_loss_scale=mtp_lambda(cfg, 0), features=features)
    vpp = parallel_state.get_virtual_pipeline_model_parallel_world_size()
    stages = [None] if vpp is None else list(range(vpp))
    ddp = ddp_config(cfg, features)
    chunks = []
    for vp in stages:
        model = family.build_model(
            cfg, tconfig, platform, vocab_size,
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp),
            vp_stage=vp,
        )
        initialize_layout_invariant(model, cfg.training.seed, tconfig.init_method_std, tconfig.num_layers)
        if not platform.is_cpu:
            model = model.cuda()
        if cfg.training.precision != "fp32":
            from megatron.core.transformer.module import Float16Module

            model = Float16Module(tconfig, model)
        # megatron-core buckets only the first chunk's gradients (the others finish their backward
        # while the first is still running; Megatron-LM does the same)
        chunks.append(DistributedDataParallel(config=tconfig, ddp_config=ddp, module=model,
                                              disable_bucketing=(vp or 0) > 0))
    for chunk in chunks:
        chunk.broadcast_params()
    _wire_schedule_hooks(tconfig, chunks, ddp)
    optimizer = scheduler = None
    if with_optimizer:
        use_optimizers(platform, cfg.optimizer.cpu_optimizer)
        optimizer = get_megatron_optimizer(optimizer_config(cfg), chunks)
        use_fused_torch_adam(optimizer, platform)
        scheduler = build_lr_scheduler(cfg, optimizer)
    # Performs the DP/EP grad all-reduce, the expert-bias update and the all-reduce of
    # sequence-parallel norm grads over TP; megatron-core schedules call it after backward.
    tconfig.finalize_model_grads_func = (_keeping_base_expert_bias(finalize_model_grads, chunks)
                                         if cfg.mtp.freeze_base else finalize_model_grads)
    return Components(config=tconfig, model=chunks, optimizer=optimizer, scheduler=scheduler,
                      vocab_size=vocab_size, features=features)


def _keeping_base_expert_bias(finalize, chunks: list):
    """finalize_model_grads that leaves the frozen main model's router expert biases as loaded, bit for
    bit (megatron-core updates every router's bias; a frozen base counts no tokens, so its update would
    be +0, which still turns a -0.0 into +0.0). The MTP layers' routers (any style's) keep their update."""
    trained = mtp_key_prefixes()  # every MTP style's modules (the sequential block, parallel heads, a drafter)
    biases = [module.expert_bias for chunk in chunks for name, module in unwrap(chunk).named_modules()
              if getattr(module, "expert_bias", None) is not None and not (name + ".").startswith(trained)]

    def finalize_keeping(*args, **kwargs):
        kept = [b.clone() for b in biases]
        finalize(*args, **kwargs)
        for bias, old in zip(biases, kept):
            bias.copy_(old)

    return finalize_keeping


def _wire_schedule_hooks(tconfig, chunks: list, ddp) -> None:
    """What megatron-core's schedules call around micro-batches: one function per chunk (a list with
    the interleaved schedule). The grad-sync hooks start each chunk's reduce as soon as its last
    micro-batch's backward is done; the param-sync hooks gather the next chunk's parameters early."""

    def per_chunk(fns):
        return fns if len(fns) > 1 else fns[0]

    tconfig.no_sync_func = per_chunk([c.no_sync for c in chunks])
    if ddp.overlap_grad_reduce:
        tconfig.grad_sync_func = per_chunk([c.start_grad_sync for c in chunks])
    if ddp.overlap_param_gather and ddp.align_param_gather:
        tconfig.param_sync_func = per_chunk([c.start_param_sync for c in chunks])


def unwrap(module):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(module, "module"):
        module = module.module
    return module
