"""Optimisation, schedule, precision, checkpointing and logging."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Optional

from megatron_mtp.config.parallel import Toggle


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
    precision_aware: bool = False
    """megatron-core's precision-aware optimizer: Adam moments in moment_dtype, fp32 main parameters
    (GPU with Transformer Engine's FusedAdam, or with offload_fraction > 0)."""
    moment_dtype: Literal["fp32", "bf16"] = "fp32"
    """dtype of Adam's exp_avg and exp_avg_sq (bf16 needs precision_aware on GPU with Transformer
    Engine and no offload: megatron-core's offload optimizer keeps fp32 moments)."""
    offload_fraction: float = 0.0
    """Fraction of the optimizer state (by parameter count) kept in host memory and stepped on the
    CPU (megatron-core's HybridDeviceOptimizer; needs precision_aware and bf16/fp16 training)."""
    offload_overlap: bool = False
    """With offload: overlap the device-to-host and host-to-device copies with the optimizer step."""
    cpu_optimizer: Literal["torch", "deepspeed"] = "torch"
    """Host-side Adam of the offloaded part: torch's fused AdamW, or DeepSpeed's CPUAdam (the
    optional `deepspeed` extra)."""


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
class LossSpikeConfig:
    factor: Optional[float] = None
    """A step's LM loss above factor × the median of the last `window` steps counts as a spike
    (null: the rule is off)."""
    window: int = 100
    """Steps in the running median."""
    patience: int = 5
    """Spiking steps in a row that trigger the action."""
    action: Literal["stop", "rollback"] = "stop"
    """stop the run, or roll back to the newest checkpoint saved before the spike began and skip the
    data consumed since then."""
    max_rollbacks: int = 3
    """With rollback: stop instead once this many rollbacks happened in one run."""


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
    rampup_batch_size: Optional[list[int]] = None
    """[START, INCREMENT, SAMPLES]: the global batch grows from START by INCREMENT, in equal steps over
    the first SAMPLES samples, to global_batch_size (megatron-core's ramp-up; DeepSeek-V3's 3,072 ->
    15,360 over 469B tokens at 4,096 tokens is [3072, 96, 114501953]). Every size must be a multiple of
    micro_batch_size x data-parallel size. null: global_batch_size from the first step."""
    seed: int = 1234
    """Seed for initialisation, data order and dropout. The initial weights depend on it and not on
    the parallel layout (models/initialization.py)."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """Compute precision (parameters are kept in fp32 for the optimizer in bf16/fp16)."""
    fp8: Optional[Literal["delayed", "tensorwise", "blockwise", "mxfp8", "nvfp4"]] = None
    """Low-precision recipe through Transformer Engine (GPU only): delayed or tensorwise (per-tensor FP8
    scales; Ada, Hopper, Blackwell), blockwise (DeepSeek-V3's 128x128 FP8 blocks; Hopper, Blackwell), mxfp8
    or nvfp4 (4-bit; both Blackwell data-center GPUs only). Checked against the GPU by plan, submit and
    train (platform/low_precision.py). null: no low precision."""
    bf16_first_last_layers: Optional[list[int]] = None
    """With fp8: [START, END], the first START and last END decoder layers stay in bf16 (megatron-core's
    first_last_layers_bf16; DeepSeek-V3 style recipes keep the layers next to the embedding and the head out
    of FP8). Not with fp8=delayed. null: every layer in the recipe."""
    fp8_param_gather: bool = False
    """With fp8: keep parameters in FP8 and all-gather them in FP8 (saves the bf16 weight copy)."""
    grad_reduce_dtype: Literal["fp32", "bf16"] = "fp32"
    """dtype of gradient accumulation buffers and their data-parallel reduction."""
    manual_gc_interval: int = 0
    """0: Python's automatic garbage collection. N > 0: automatic collection off, a full collection
    every N steps and around evaluations, at the same time on every rank (avoids stragglers)."""
    on_nonfinite: Literal["stop", "skip"] = "stop"
    """A step whose loss or gradient norm is not finite: stop (the run ends with one sentence naming
    the step and the last checkpoint; nothing non-finite is saved) or skip (the update is not
    applied, the data is consumed; see max_skipped_steps)."""
    max_skipped_steps: int = 5
    """With on_nonfinite=skip: stop after this many skipped steps in a row."""
    loss_spike: LossSpikeConfig = field(default_factory=LossSpikeConfig)
    """Loss-spike rule (off unless loss_spike.factor is set)."""
    device: Literal["auto", "cpu", "cuda"] = "auto"
    """Where to run: auto picks cuda when a GPU is visible."""
    deterministic: bool = False
    """Ask torch for deterministic algorithms (slower)."""
    collective_timeout: float = 1800.0
    """Seconds a collective (all-reduce, all-to-all, ...) may wait for the other ranks before
    torch.distributed fails it (the timeout of the world group and of every group megatron-core builds)."""
    hang_timeout: float = 600.0
    """Seconds without progress after which the job ends with one sentence naming the rank that stopped
    reporting, the checkpoint writer that stopped writing, or the step every rank waits in, so that the
    launcher or the Slurm job restarts it from the latest checkpoint (training/watchdog.py). Progress is
    a step, an evaluation or a save ending, and, during a save, any rank's checkpoint writer adding
    bytes: a long save that keeps writing is never cut off. Must exceed the longest step and evaluation,
    and the longest pause of a save's writer (planning, gathering, publishing); 0: off (then only
    collective_timeout ends a stuck collective), else at least 1."""


@dataclass
class CheckpointConfig:
    save_interval: int = 100
    """Save every N steps (and always at the end and on a save-and-exit signal); 0: only at the end (below
    0 is refused)."""
    save_interval_minutes: float = 0.0
    """Also save when this many minutes have passed since the last save (or the start), by rank 0's
    clock, agreed at the step's agreement point; 0: off. Beside save_interval, it bounds the work a
    crash loses when steps take longer than planned."""
    keep_last: int = 2
    """Keep the newest K checkpoints; older ones are deleted after a save succeeds (0: keep all)."""
    load: Optional[str] = None
    """Checkpoint directory (or run directory) to initialise from when the run directory has none."""
    load_optimizer: bool = True
    """With `load`: also restore optimizer, scheduler and progress (false: weights only, fresh start)."""
    exit_signals: list[str] = None  # type: ignore[assignment]
    """Signals that make the trainer finish the step, save and exit (default SIGUSR1, SIGTERM)."""
    async_save: Toggle = "auto"
    """Write checkpoints in the background while training goes on (megatron-core async save; the
    step_N rename and `latest` follow once every rank's write completed). auto: on with GPUs; off on
    CPU, where the writer would take cores from the training step (true still works there)."""
    fully_parallel_save: bool = True
    """Spread the writing of replicated tensors over the data-parallel ranks (megatron-core's
    fully parallel save) instead of the first replica writing them all."""
    optimizer_format: Literal["parallel", "reshardable"] = "parallel"
    """How the distributed optimizer's state is saved. parallel: every rank writes its own shard, with no
    exchange and no extra memory; a resume may change the data-parallel size only (another TP, PP, VPP,
    EP or bucket size is refused in one sentence). reshardable: gathered over the data-parallel ranks
    into one tensor per parameter, which every rank holds on the host while saving (`plan` shows the
    cost), so that any layout resumes it; for a run that will change its model-parallel layout."""
    fully_parallel_load: bool = True
    """Spread the reading of a checkpoint over the data-parallel ranks and exchange the pieces."""
    start_fresh: bool = False
    """Start from scratch even though the run directory holds checkpoints (they are moved to
    checkpoints.old-<time>/, never deleted)."""

    def __post_init__(self):
        if self.exit_signals is None:
            self.exit_signals = ["SIGUSR1", "SIGTERM"]


@dataclass
class LoggingConfig:
    log_interval: int = 10
    """Print a console line and write TensorBoard scalars every N steps."""
    tensorboard: bool = True
    """Write TensorBoard event files under RUN_DIR/tensorboard."""
    wandb_project: Optional[str] = None
    """Also log every scalar to this Weights & Biases project (the `wandb` extra), with the run's
    config; a resumed run continues the same W&B run. null: the environment's WANDB_PROJECT, and no W&B
    where that is unset too (config/wandb_env.py)."""
    wandb_entity: Optional[str] = None
    """The W&B team or user that owns the project (null: the environment's WANDB_ENTITY, else the
    logged-in user's default)."""
    wandb_name: Optional[str] = None
    """The W&B run's display name (null: the config's name)."""
    wandb_mode: Optional[Literal["online", "offline", "disabled"]] = None
    """offline: write WANDB_DIR/wandb/ without a network, to upload later with `wandb sync`; disabled: no
    W&B. null: the environment's WANDB_MODE, else online, which needs a W&B API key (WANDB_API_KEY or
    `wandb login`; checked before the ranks start)."""
    wandb_dir: Optional[str] = None
    """Where W&B writes its files (a wandb/ folder inside). null: the environment's WANDB_DIR, else the run
    directory."""
    eval_interval: int = 0
    """Evaluate on the validation split every N steps (0: never during training)."""
    eval_steps: int = 4
    """Global batches per evaluation."""
