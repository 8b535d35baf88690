"""Learning-rate scheduler (megatron-core's) and the MTP loss-weight (λ) schedule by consumed tokens.

Design note. On resume the config's schedule wins: megatron-core's scheduler is built with
override_opt_param_scheduler, so its load takes only the step counter from the checkpoint, and the
learning rate, minimum, warm-up, decay steps (which follow a longer training.max_steps) and style and
the weight decay are the config's. The optimizer's parameter groups are loaded from the checkpoint too
(megatron-core keeps each group's max_lr/min_lr and weight-decay ends there, torch the betas and eps),
so `config_hyperparameters_kept` puts the live groups' values, built from this config, back after the
load. `schedule_changes` names what differs from the checkpoint's config, for the one note
the trainer prints.
"""

from __future__ import annotations

import contextlib

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
        use_checkpoint_opt_param_scheduler=False,
        override_opt_param_scheduler=True,  # the config's schedule wins on resume (design note)
        wsd_decay_steps=s.wsd_decay_steps if s.decay_style == "wsd" else None,
        lr_wsd_decay_style=s.wsd_decay_style if s.decay_style == "wsd" else None,
    )


SCHEDULE_FIELDS = (
    "optimizer.lr", "optimizer.min_lr", "optimizer.weight_decay", "optimizer.adam_beta1", "optimizer.adam_beta2",
    "optimizer.adam_eps", "schedule.warmup_steps", "schedule.decay_steps", "schedule.decay_style",
    "schedule.wsd_decay_steps", "schedule.wsd_decay_style", "training.max_steps",
)
"""The config fields the learning-rate schedule and the optimizer's update rule are made of."""


def schedule_changes(saved: Config, now: Config) -> list[str]:
    """'FIELD A -> B' for each schedule field the resumed config changes (a longer training.max_steps
    stretches the decay when schedule.decay_steps is unset)."""
    changes = []
    for dotted in SCHEDULE_FIELDS:
        if dotted == "training.max_steps" and now.schedule.decay_steps:
            continue  # the decay has its own length
        section, name = dotted.split(".")
        before, after = getattr(getattr(saved, section), name), getattr(getattr(now, section), name)
        if before != after:
            changes.append(f"{dotted} {before} -> {after}")
    return changes


HYPERPARAMETER_KEYS = ("max_lr", "min_lr", "start_wd", "end_wd", "betas", "eps")
"""What megatron-core's parameter groups hold of the config's schedule and update rule."""


@contextlib.contextmanager
def config_hyperparameters_kept(optimizer):
    """Around an optimizer load: the live parameter groups' schedule values, betas and eps (built from
    this config) are put back over the loaded ones, group by group."""
    live = [{k: group[k] for k in HYPERPARAMETER_KEYS if k in group} for group in optimizer.param_groups]
    yield
    loaded = optimizer.param_groups
    if len(loaded) != len(live):
        raise RuntimeError(f"the optimizer has {len(loaded)} parameter groups after a load and {len(live)} before")
    for group, values in zip(loaded, live):
        group.update(values)
