"""Decide where a run executes and which megatron-core backends it uses."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.errors import UserError
from megatron_mtp.platform import checkpoint_writer, optimizer_load, write_progress
from megatron_mtp.platform.known_warnings import silence_known_harmless


@dataclass(frozen=True)
class Platform:
    device: str
    """'cuda' or 'cpu'."""
    backend: str
    """torch.distributed backend: 'nccl' or 'gloo'."""
    use_te: bool
    """Build Transformer Engine specs (GPU with transformer_engine importable)."""

    @property
    def is_cpu(self) -> bool:
        return self.device == "cpu"

    def synchronize(self) -> None:
        """Wait for the device's queued work (a no-op on CPU, where work is never queued)."""
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()


_CURRENT: Optional[Platform] = None


def te_available() -> bool:
    """transformer_engine importable (checked lazily: it needs CUDA libraries)."""
    if importlib.util.find_spec("transformer_engine") is None:
        return False
    try:
        import transformer_engine.pytorch  # noqa: F401
    except Exception:  # a broken or CUDA-less install counts as absent
        return False
    return True


def detect(device: str = "auto", backend: str = "auto", fp8: Optional[str] = None) -> Platform:
    """Resolve device/backend/TE use for a config; raises UserError for impossible requests."""
    import torch

    cuda = torch.cuda.is_available()
    if device == "auto":
        device = "cuda" if cuda else "cpu"
    if device == "cuda" and not cuda:
        raise UserError("training.device is 'cuda' but no CUDA GPU is visible; set training.device=cpu or auto")
    if backend == "auto":
        backend = "nccl" if device == "cuda" else "gloo"
    if backend == "nccl" and device == "cpu":
        raise UserError("parallel.backend is 'nccl' but the run is on CPU; use parallel.backend=gloo or auto")
    use_te = device == "cuda" and te_available()
    if fp8 is not None:
        if device != "cuda":
            raise UserError(
                f"training.fp8={fp8} needs a CUDA GPU with Transformer Engine, but this run is on CPU; "
                "remove training.fp8 (or set it to null) to train without FP8"
            )
        if not use_te:
            raise UserError(
                f"training.fp8={fp8} needs Transformer Engine, which is not installed here; "
                "install the 'gpu' extra (pip install 'megatron-mtp[gpu]') or set training.fp8=null"
            )
        from megatron_mtp.platform.low_precision import check_recipe, device_capability

        check_recipe(fp8, device_capability(), torch.cuda.get_device_name())
    return Platform(device=device, backend=backend, use_te=use_te)


def setup(device: str = "auto", backend: str = "auto", fp8: Optional[str] = None) -> Platform:
    """Detect the platform once per process and make megatron-core run on it."""
    global _CURRENT
    from megatron_mtp.platform.megatron_core import check_supported

    check_supported()
    plat = detect(device, backend, fp8)
    silence_known_harmless(plat)
    checkpoint_writer.apply()
    write_progress.apply()
    optimizer_load.apply()
    if plat.is_cpu:
        from megatron_mtp.platform import cpu

        cpu.apply()
    else:
        import torch

        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank % max(torch.cuda.device_count(), 1))
    if not plat.use_te:
        from megatron_mtp.platform import no_te

        no_te.apply()
    _CURRENT = plat
    return plat


def all_reduce_sum(tensor, op=None):
    """All-reduce a host tensor over the world, through the device the backend needs (NCCL: GPU)."""
    import torch

    plat = current()
    op = op or torch.distributed.ReduceOp.SUM
    if plat.backend == "nccl":
        dev = tensor.to("cuda")
        torch.distributed.all_reduce(dev, op=op)
        return dev.cpu()
    torch.distributed.all_reduce(tensor, op=op)
    return tensor


def current() -> Platform:
    if _CURRENT is None:
        raise RuntimeError("megatron_mtp.platform.setup() must run before the platform is queried")
    return _CURRENT
