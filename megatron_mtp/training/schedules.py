"""Learning-rate scheduler (megatron-core's) and the MTP loss-weight (λ) schedule by consumed tokens."""

from __future__ import annotations

from megatron_mtp.config import Config


def mtp_lambda(cfg: Config, consumed_tokens: int) -> float:
    """λ of the last schedule entry whose start is <= consumed_tokens (0 before the first entry)."""
    value = 0.0
    for start, lam in sorted(cfg.mtp.loss_weight_schedule, key=lambda e: e[0]):
        if consumed_tokens >= start:
            value = lam
    return value


def build_lr_scheduler(cfg: Config, optimizer):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    s, o = cfg.schedule, cfg.optimizer
    decay_steps = s.decay_steps or cfg.training.max_steps
    # megatron-core counts scheduler steps in samples when given sample counts; we count optimizer steps.
    return OptimizerParamScheduler(
        optimizer,
        init_lr=0.0,
        max_lr=o.lr,
        min_lr=o.min_lr,
        lr_warmup_steps=s.warmup_steps,
        lr_decay_steps=max(decay_steps, s.warmup_steps + 1),
        lr_decay_style="WSD" if s.decay_style == "wsd" else s.decay_style,
        start_wd=o.weight_decay,
        end_wd=o.weight_decay,
        wd_incr_steps=max(decay_steps, 1),
        wd_incr_style="constant",
        use_checkpoint_opt_param_scheduler=True,
        override_opt_param_scheduler=False,
        wsd_decay_steps=s.wsd_decay_steps if s.decay_style == "wsd" else None,
        lr_wsd_decay_style=s.wsd_decay_style if s.decay_style == "wsd" else None,
    )
