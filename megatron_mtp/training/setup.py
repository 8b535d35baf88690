"""Build everything a rank trains with: model chunk(s) in megatron DDP, optimizer, LR scheduler."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from megatron_mtp.config import Config
from megatron_mtp.models.deepseek_v3.model import build_model
from megatron_mtp.models.deepseek_v3.transformer_config import build_transformer_config
from megatron_mtp.platform import Platform
from megatron_mtp.training.schedules import build_lr_scheduler, mtp_lambda


@dataclass
class TrainState:
    """Everything restored on resume besides tensors."""

    step: int = 0
    consumed_samples: int = 0
    consumed_tokens: int = 0


@dataclass
class Components:
    config: Any  # megatron TransformerConfig (shared by every module: λ is updated here)
    model: list  # model chunks (one per virtual stage; we use one), DDP-wrapped
    optimizer: Any
    scheduler: Any
    vocab_size: int


def build_components(cfg: Config, platform: Platform, vocab_size: int, with_optimizer: bool = True) -> Components:
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    tconfig = build_transformer_config(cfg, platform, mtp_loss_scale=mtp_lambda(cfg, 0))
    model = build_model(
        cfg, tconfig, platform, vocab_size,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
    )
    if not platform.is_cpu:
        model = model.cuda()
    if cfg.training.precision != "fp32":
        from megatron.core.transformer.module import Float16Module

        model = Float16Module(tconfig, model)
    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=True,
        overlap_grad_reduce=False,
        use_distributed_optimizer=cfg.parallel.distributed_optimizer,
    )
    model = DistributedDataParallel(config=tconfig, ddp_config=ddp_config, module=model)
    model.broadcast_params()
    chunks = [model]
    # Performs the DP/EP grad all-reduce, the expert-bias update and the all-reduce of
    # sequence-parallel norm grads over TP; megatron-core schedules call it after backward.
    tconfig.finalize_model_grads_func = finalize_model_grads
    tconfig.no_sync_func = model.no_sync
    optimizer = scheduler = None
    if with_optimizer:
        o = cfg.optimizer
        opt_config = OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            min_lr=o.min_lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.adam_beta1,
            adam_beta2=o.adam_beta2,
            adam_eps=o.adam_eps,
            clip_grad=o.clip_grad,
            bf16=cfg.training.precision == "bf16",
            fp16=cfg.training.precision == "fp16",
            params_dtype=torch.float32,
            use_distributed_optimizer=cfg.parallel.distributed_optimizer,
        )
        optimizer = get_megatron_optimizer(opt_config, chunks)
        scheduler = build_lr_scheduler(cfg, optimizer)
    return Components(config=tconfig, model=chunks, optimizer=optimizer, scheduler=scheduler, vocab_size=vocab_size)


def unwrap(module):
    """The GPTModel inside DDP / Float16Module wrappers."""
    while hasattr(module, "module"):
        module = module.module
    return module
