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
)


QUIET_LOGGERS = {
    "megatron.core.dist_checkpointing.strategies.filesystem_async":
        "its writer logs each failed write before raising it; the trainer reports the failure itself, as "
        "one sentence (a full disk, a read-only directory), or re-raises it with its traceback",
}


def silence_known_harmless(platform: Optional[object] = None) -> None:
    """Install the filters (platform: a Platform; None counts as CPU)."""
    import logging

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.CRITICAL)
    is_cpu = platform is None or getattr(platform, "is_cpu", True)
    for known in KNOWN_HARMLESS:
        if known.cpu_only and not is_cpu:
            continue
        warnings.filterwarnings("ignore", message=known.message, category=known.category, module=known.module)
