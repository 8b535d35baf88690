"""Warnings (and log lines) from megatron-core and torch that a user can do nothing about, silenced with
the reason.

Each entry matches one message (and, where the message is generic, the module that raises it), so
every other warning stays visible.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True)
class KnownWarning:
    category: type
    message: str
    """Regex matched against the start of the warning text."""
    reason: str
    module: str = ""
    """Regex of the raising module ('' = any)."""
    cpu_only: bool = False
    """Still shown on GPUs, where it says something a user can act on."""


KNOWN_HARMLESS = (
    KnownWarning(UserWarning, r"Apex is not installed\. Falling back to Torch Norm",
                 "without Transformer Engine the specs use the project's own RMSNorm (platform/local_modules.py), "
                 "never megatron-core's apex or torch fallback"),
    KnownWarning(UserWarning, r"full scope is deprecated",
                 "megatron-core 0.16's own default cuda_graph_scope triggers it; CUDA graphs are not used"),
    KnownWarning(UserWarning, r"The \.grad attribute of a Tensor that is not a leaf Tensor",
                 "megatron-core's DistributedOptimizer.zero_grad reads .grad of its shard views (its source notes "
                 "'throws grad-access warning'); on CPU the access passes through platform/cpu.py",
                 module=r"megatron_mtp\.platform\.cpu|megatron\.core\.optimizer"),
    KnownWarning(FutureWarning, r"`torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated",
                 "megatron-core 0.16 calls torch's older collective names; the behaviour is the same"),
    KnownWarning(FutureWarning, r"`load_state_dict` is deprecated and will be removed",
                 "megatron-core 0.16's torch_dist reader calls torch.distributed.checkpoint's older entry point",
                 module=r"megatron\.core\.dist_checkpointing"),
    KnownWarning(FutureWarning, r"Please use DTensor instead and we are deprecating ShardedTensor",
                 "megatron-core 0.16 reads torch_dist checkpoints through torch's ShardedTensor"),
    KnownWarning(UserWarning, r"Transformer Engine and Apex are not installed\. Falling back to local implementations",
                 "on CPU the local multi-tensor kernels are the only ones there are", cpu_only=True),
    KnownWarning(UserWarning, r"Transformer Engine and Apex are not installed\. Falling back to Torch optimizers",
                 "on CPU torch's Adam is the optimizer (the platform layer picks its fastest path)", cpu_only=True),
    KnownWarning(UserWarning, r"MimoModelConfig is experimental",
                 "megatron-core 0.19 defines its multimodal model config when its optimizer package is imported; "
                 "no multimodal model is built here"),
    KnownWarning(UserWarning, r"torch\.distributed is disabled, unavailable or uninitialized",
                 "megatron-core 0.19's torch_dist reader passes no_dist=True to torch.distributed.checkpoint on "
                 "purpose (its own planner already agreed on the shards), and torch warns whenever it does"),
)


@dataclass(frozen=True)
class KnownLogLine:
    logger: str
    message: str
    """Regex matched against the start of the log message."""
    reason: str


KNOWN_LOG_LINES = (
    KnownLogLine("megatron.core.models.gpt.gpt_model", r"GPTModel IS DEPRECATED",
                 "megatron-core 0.19 asks new code to use HybridModel, whose migration is for Mamba-style hybrid "
                 "stacks; GPTModel still builds every family's decoder and MTP block, on 0.16 as on 0.19"),
    KnownLogLine("megatron.core.distributed.distributed_data_parallel", r"DistributedDataParallel: full_param_layout",
                 "megatron-core 0.19 then computes the layout itself, exactly as a caller would "
                 "(DistributedOptimizer.compute_full_param_layout with DDP's own bucket and group sizes)"),
    KnownLogLine("megatron.core.dist_checkpointing.strategies.torch", r"MCore's async save is deprecated",
                 "megatron-core 0.19's synchronous save always runs its built-in writer (strategy.save passes "
                 "async_strategy='mcore'), so every save logs it; NVRx (nvidia-resiliency-ext) is a separate package"),
    KnownLogLine("megatron.core.dist_checkpointing.strategies.common", r"load_common is deprecated",
                 "megatron-core 0.19 reads common.pt, which our checkpoints keep so that 0.16 can resume them "
                 "(platform/megatron_core.py, write_legacy_common); the same state is inside the shards too"),
    KnownLogLine("torch.utils.cpp_extension", r"No CUDA runtime is found",
                 "torch's CUDA build (the one the index serves for Python 3.12) says so when imported on a machine "
                 "without a GPU; the run is on CPU and compiles no CUDA extension"),
)


class _DropKnownLines:
    """A logging filter dropping the records whose message starts with one of the known patterns."""

    def __init__(self, patterns):
        import re

        self.patterns = [re.compile(p) for p in patterns]

    def filter(self, record) -> bool:
        text = str(record.msg)
        return not any(p.match(text) for p in self.patterns)


QUIET_LOGGERS = {
    "megatron.core.dist_checkpointing.strategies.filesystem_async":
        "its writer logs each failed write before raising it; the trainer reports the failure itself, as "
        "one sentence (a full disk, a read-only directory), or re-raises it with its traceback",
}


def silence_known_harmless(platform: Optional[object] = None) -> None:
    """Install the filters (platform: a Platform; None counts as CPU)."""
    is_cpu = platform is None or getattr(platform, "is_cpu", True)
    silence_everywhere_harmless()
    for known in KNOWN_HARMLESS:
        if known.cpu_only and is_cpu:
            warnings.filterwarnings("ignore", message=known.message, category=known.category, module=known.module)


def silence_everywhere_harmless() -> None:
    """The filters that hold on any platform (the CLI installs them before a command imports anything)."""
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    by_logger: dict[str, list[str]] = {}
    for line in KNOWN_LOG_LINES:
        by_logger.setdefault(line.logger, []).append(line.message)
    for name, patterns in by_logger.items():
        log = logging.getLogger(name)
        if not any(isinstance(f, _DropKnownLines) for f in log.filters):
            log.addFilter(_DropKnownLines(patterns))
    for known in KNOWN_HARMLESS:
        if not known.cpu_only:
            warnings.filterwarnings("ignore", message=known.message, category=known.category, module=known.module)
