"""Make megatron-core's real code path run on CPU with gloo.

Design note. megatron-core assumes CUDA in four ways, each neutralised here and nowhere else:
  1. Device choice: `torch.cuda.current_device()`, literal `device="cuda"`, `.cuda()` and
     `.to("cuda")` in schedules, optimizer, grad clipping, checkpoint exchange. A TorchFunctionMode
     (`_CudaToCpu`) rewrites any CUDA device argument to CPU, makes `.cuda()` a no-op, and reports
     CPU float tensors as `torch.cuda.*` from `Tensor.type()` (the optimizer asserts on that name).
  2. Streams/events/synchronize (the alltoall dispatcher builds a stream in __init__): synchronous
     stand-ins, since CPU ops complete in order.
  3. Gloo limits: all_to_all_single needs Python/numpy split sizes (megatron keeps CPU tensors),
     and all_gather of uneven shards is unsupported (pad, gather, slice).
  4. CUDA RNG states around recomputed regions, NVTX ranges: empty stand-ins.
The optimizer on CPU (fused torch Adam, the offload optimizer's split) is set in optimizers.py.
`check_assumptions()` verifies every patched target still exists with the shape we rely on, so a
megatron-core upgrade that moves one fails loudly in tests/unit/test_platform.py instead of
silently running a different path.
"""

from __future__ import annotations

import contextlib
import functools
import os

import torch
from torch.overrides import TorchFunctionMode

_APPLIED = False


def _is_cuda(device) -> bool:
    if isinstance(device, torch.device):
        return device.type == "cuda"
    if isinstance(device, str):
        return device.startswith("cuda")
    return False


class _CudaToCpu(TorchFunctionMode):
    """Redirect CUDA placements to CPU (see the module note)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.cuda:
            return args[0]
        if func is torch.Tensor.type and len(args) == 1 and not kwargs:
            name = func(*args)
            return name.replace("torch.", "torch.cuda.", 1) if not name.startswith("torch.cuda.") else name
        if func is torch.Tensor.to:
            args = tuple("cpu" if _is_cuda(a) else a for a in args)
        if "device" in kwargs and _is_cuda(kwargs["device"]):
            kwargs["device"] = "cpu"
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
        return func(*args, **kwargs)


class _Stream:
    """Synchronous stand-in for torch.cuda.Stream."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _Event()

    def synchronize(self):
        pass

    def __eq__(self, other):
        return isinstance(other, _Stream)

    def __hash__(self):
        return 0


class _Event:
    def __init__(self, *args, **kwargs):
        pass

    def record(self, stream=None):
        pass

    def wait(self, stream=None):
        pass

    def synchronize(self):
        pass

    def query(self):
        return True

    def elapsed_time(self, other):
        return 0.0


_DEFAULT_STREAM = _Stream()


def _patch_torch_cuda() -> None:
    cuda = torch.cuda
    cuda.current_device = lambda: "cpu"
    cuda.Stream = _Stream
    cuda.Event = _Event
    cuda.current_stream = lambda device=None: _DEFAULT_STREAM
    cuda.default_stream = lambda device=None: _DEFAULT_STREAM
    cuda.stream = lambda stream=None: contextlib.nullcontext()
    cuda.synchronize = lambda device=None: None
    cuda.set_device = lambda device: None
    for name in ("memory_allocated", "max_memory_allocated", "memory_reserved", "max_memory_reserved"):
        setattr(cuda, name, lambda device=None: 0)
    cuda.reset_peak_memory_stats = lambda device=None: None
    cuda.empty_cache = lambda: None
    # NVTX ranges (the combined 1F1B schedule of the expert-parallel all-to-all overlap) need CUDA.
    cuda.nvtx.range_push = lambda msg: 0
    cuda.nvtx.range_pop = lambda: 0
    # Tensor.record_stream is a no-op concept on CPU.
    torch.Tensor.record_stream = lambda self, stream: None


def _patch_rng_for_recompute() -> None:
    """Activation recomputation saves and restores the CUDA RNG state around each recomputed region
    (tensor_parallel.random); CPU-only torch raises 'Torch not compiled with CUDA enabled'. The CPU
    generator is saved and restored by the same code already, so the CUDA part is an empty stand-in."""
    from megatron.core.tensor_parallel import random as mrandom

    mrandom._get_cuda_rng_state = lambda device="cuda", clone=False, graph_safe=False: torch.empty(0, dtype=torch.uint8)
    mrandom._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: None


def _patch_gloo_collectives() -> None:
    from megatron.core.tensor_parallel import mappings
    from megatron.core.transformer.moe import token_dispatcher

    original_move = token_dispatcher.maybe_move_tensor_to_cpu

    @functools.wraps(original_move)
    def move_to_cpu(tensor, as_numpy=False, record_stream=False):
        if torch.is_tensor(tensor) and as_numpy:
            return tensor.cpu().numpy()
        return original_move(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = move_to_cpu

    original_gather = mappings._gather_along_first_dim

    @functools.wraps(original_gather)
    def gather_along_first_dim(input_, group, output_split_sizes=None, use_global_buffer=False):
        if output_split_sizes is None or group.size() == 1:
            return original_gather(input_, group, output_split_sizes, use_global_buffer)
        sizes = [int(s) for s in output_split_sizes]
        longest = max(sizes)
        padded = input_.new_zeros((longest,) + tuple(input_.shape[1:]))
        padded[: input_.shape[0]] = input_
        chunks = [torch.empty_like(padded) for _ in sizes]
        torch.distributed.all_gather(chunks, padded.contiguous(), group=group)
        return torch.cat([c[:n] for c, n in zip(chunks, sizes)], dim=0)

    mappings._gather_along_first_dim = gather_along_first_dim


def _disable_dynamo() -> None:
    # torch.compile on CPU makes the first step ~50x slower for identical numbers.
    os.environ.setdefault("TORCHDYNAMO_DISABLE", "1")
    try:
        import torch._dynamo

        torch._dynamo.config.disable = True
    except Exception:
        pass


def check_assumptions() -> list[str]:
    """Names of megatron-core/torch targets this module patches that no longer exist."""
    import importlib

    missing = []
    targets = {
        "megatron.core.tensor_parallel.mappings": ["_gather_along_first_dim"],
        "megatron.core.transformer.moe.token_dispatcher": ["maybe_move_tensor_to_cpu"],
        "megatron.core.tensor_parallel.random": ["_get_cuda_rng_state", "_set_cuda_rng_state"],
        "torch.cuda": ["current_device", "Stream", "Event", "current_stream", "stream", "synchronize"],
        "torch.cuda.nvtx": ["range_push", "range_pop"],
    }
    for module_name, attrs in targets.items():
        module = importlib.import_module(module_name)
        missing += [f"{module_name}.{a}" for a in attrs if not hasattr(module, a)]
    return missing


def apply() -> None:
    """Idempotently neutralise megatron-core's CUDA assumptions for this process."""
    global _APPLIED
    if _APPLIED:
        return
    missing = check_assumptions()
    if missing:
        raise RuntimeError(
            "megatron-core changed in a way the CPU platform layer does not support "
            f"(missing: {', '.join(missing)}); pin megatron-core to the tested range in pyproject.toml"
        )
    _disable_dynamo()
    _patch_torch_cuda()
    _patch_gloo_collectives()
    _patch_rng_for_recompute()
    _CudaToCpu().__enter__()  # process-wide: every later torch call sees CPU placements
    _APPLIED = True
