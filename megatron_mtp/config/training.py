"""Optimisation, schedule, precision, checkpointing and logging."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Optional


@dataclass
class OptimizerConfig:
    lr: float = 3.0e-3
    """Peak learning rate."""
    min_lr: float = 3.0e-4
    """Learning rate at the end of decay."""
    weight_decay: float = 0.1
    """Decoupled weight decay (AdamW)."""
    adam_beta1: float = 0.9
    """Adam β1."""
    adam_beta2: float = 0.95
    """Adam β2."""
    adam_eps: float = 1.0e-8
    """Adam ε."""
    clip_grad: float = 1.0
    """Global gradient-norm clipping threshold (0 disables clipping)."""


@dataclass
class ScheduleConfig:
    warmup_steps: int = 20
    """Linear warmup steps from 0 to optimizer.lr."""
    decay_style: Literal["cosine", "wsd", "constant", "linear"] = "cosine"
    """Shape after warmup; wsd = warmup-stable-decay (constant, then decay over wsd_decay_steps)."""
    decay_steps: Optional[int] = None
    """Steps over which the LR decays (null: training.max_steps)."""
    wsd_decay_steps: int = 0
    """Length of the final decay phase for decay_style=wsd."""
    wsd_decay_style: Literal["linear", "cosine", "exponential", "minus_sqrt"] = "linear"
    """Shape of the WSD final decay."""


@dataclass
class TrainingConfig:
    max_steps: int = 200
    """Optimizer steps to train for (the run finishes here; resuming a finished run does nothing)."""
    seq_length: int = 128
    """Tokens per sample."""
    micro_batch_size: int = 4
    """Samples per micro-batch per data-parallel rank."""
    global_batch_size: int = 16
    """Samples per optimizer step across all data-parallel ranks (micro-batches are accumulated)."""
    seed: int = 1234
    """Seed for initialisation, data order and dropout."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision (parameters are kept in fp32 for the optimizer in bf16/fp16)."""
    fp8: Optional[Literal["delayed", "tensorwise", "blockwise", "mxfp8"]] = None
    """FP8 recipe through Transformer Engine (GPU only); null disables FP8."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run: auto picks cuda when a GPU is visible."""
    deterministic: bool = False
    """Ask torch for deterministic algorithms (slower)."""


@dataclass
class CheckpointConfig:
    save_interval: int = 100
    """Save every N steps (and always at the end and on a save-and-exit signal); 0: only at the end."""
    keep_last: int = 2
    """Keep the newest K checkpoints; older ones are deleted after a save succeeds (0: keep all)."""
    load: Optional[str] = None
    """Checkpoint directory (or run directory) to initialise from when the run directory has none."""
    load_optimizer: bool = True
    """With `load`: also restore optimizer, scheduler and progress (false: weights only, fresh start)."""
    exit_signals: list[str] = None  # type: ignore[assignment]
    """Signals that make the trainer finish the step, save and exit (default SIGUSR1, SIGTERM)."""

    def __post_init__(self):
        if self.exit_signals is None:
            self.exit_signals = ["SIGUSR1", "SIGTERM"]


@dataclass
class LoggingConfig:
    log_interval: int = 10
    """Print a console line and write TensorBoard scalars every N steps."""
    tensorboard: bool = True
    """Write TensorBoard event files under RUN_DIR/tensorboard."""
    eval_interval: int = 0
    """Evaluate on the validation split every N steps (0: never during training)."""
    eval_steps: int = 4
    """Global batches per evaluation."""
