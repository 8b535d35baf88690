"""Which Adam megatron-core's optimizer builder uses, on this platform and for offloaded state.

megatron-core picks its Adam at import: Transformer Engine's FusedAdam, else apex's, else
torch.optim.AdamW with its default (foreach) implementation; its offload optimizer
(HybridDeviceOptimizer) steps the host-side part with torch.optim.AdamW. We change three things:
  - without TE and apex on CPU, torch's fused AdamW (the same math, ~5x faster on 2 threads for a
    20M-parameter step: tools/bench/bench_optimizer.py), for the plain and the offload optimizer;
  - optimizer.cpu_optimizer=deepspeed: DeepSpeed's CPUAdam steps the offloaded part instead;
  - on CPU every parameter is already a host tensor, which HybridDeviceOptimizer's split by
    `param.is_cuda` does not expect (KeyError at the first step): the model's parameters play the
    device side and the first `offload_fraction` of them get host copies stepped by the CPU Adam.
The offload optimizer keeps its sub-optimizer classes in its param groups, so they are saved in
checkpoints; torch's safe loader must be told they are allowed (every platform).
"""

from __future__ import annotations

import torch


class FusedCPUAdamW(torch.optim.AdamW):
    """torch.optim.AdamW with the fused kernel by default (megatron-core passes no `fused`)."""

    def __init__(self, params, *args, fused=True, **kwargs):
        kwargs.pop("foreach", None)
        super().__init__(params, *args, fused=fused, **kwargs)


def deepspeed_cpu_adamw():
    """DeepSpeed's CPUAdam in AdamW mode (platform/deepspeed_adam.py imports DeepSpeed)."""
    from megatron_mtp.platform.deepspeed_adam import DeepSpeedCPUAdamW

    torch.serialization.add_safe_globals([DeepSpeedCPUAdamW])
    return DeepSpeedCPUAdamW


def use_optimizers(platform, cpu_optimizer: str = "torch") -> None:
    """Set the Adam classes megatron-core's get_megatron_optimizer will build (call before it)."""
    from megatron.core import optimizer as mopt

    torch.serialization.add_safe_globals([torch.optim.AdamW, torch.optim.SGD, FusedCPUAdamW])
    if platform.is_cpu and mopt.Adam is torch.optim.AdamW:
        mopt.Adam = FusedCPUAdamW  # the offload optimizer's "device" side
    mopt.CPUAdam = deepspeed_cpu_adamw() if cpu_optimizer == "deepspeed" else (
        FusedCPUAdamW if platform.is_cpu else torch.optim.AdamW)
    if platform.is_cpu:
        _patch_offload_split_on_cpu()


def use_fused_torch_adam(optimizer, platform) -> None:
    """On CPU, switch the torch AdamW that megatron-core builds by name (its plain, non-offload path)
    to the fused implementation: torch reads `fused` from the param groups at every step."""
    if not platform.is_cpu:
        return
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_optimizer = getattr(inner, "optimizer", None)
        if type(torch_optimizer) is torch.optim.AdamW:
            for group in torch_optimizer.param_groups:
                if all(p.dtype in (torch.float32, torch.float16, torch.bfloat16) for p in group["params"]):
                    group["foreach"], group["fused"] = False, True


def _patch_offload_split_on_cpu() -> None:
    from megatron.core.optimizer.cpu_offloading import hybrid_optimizer

    cls = hybrid_optimizer.HybridDeviceOptimizer
    if getattr(cls._get_sub_optimizer_param_groups, "_megatron_mtp_patched", False):
        return

    def groups(self, offload_fraction):
        params = [p for g in self.param_groups for p in g["params"]]
        threshold = sum(p.numel() for p in params) * offload_fraction
        offloaded = 0
        cpu_groups, dev_groups, dev_to_copy, copy_to_dev, to_fp32 = [], [], {}, {}, {}
        for group in self.param_groups:
            cpu_group, dev_group = {**group, "params": []}, {**group, "params": []}
            for param in group["params"]:
                inner, offload = param, offloaded < threshold
                if offload:  # a separate host copy, stepped by the host optimizer
                    inner = param.detach().clone()
                    offloaded += param.numel()
                if self.param_update_in_fp32 and inner.dtype != torch.float32:
                    inner = inner.detach().clone().float()
                    to_fp32[param] = inner
                if offload:
                    dev_to_copy[param], copy_to_dev[inner] = inner, param
                (cpu_group if offload else dev_group)["params"].append(inner)
            cpu_groups += [cpu_group] if cpu_group["params"] else []
            dev_groups += [dev_group] if dev_group["params"] else []
        return cpu_groups, dev_groups, dev_to_copy, copy_to_dev, to_fp32

    groups._megatron_mtp_patched = True
    cls._get_sub_optimizer_param_groups = groups


def check_assumptions() -> list[str]:
    """Names of megatron-core targets this module replaces that no longer exist."""
    import importlib

    targets = {"megatron.core.optimizer": ["Adam", "CPUAdam", "get_megatron_optimizer"],
               "megatron.core.optimizer.cpu_offloading.hybrid_optimizer": ["HybridDeviceOptimizer"]}
    missing = []
    for name, attrs in targets.items():
        module = importlib.import_module(name)
        missing += [f"{name}.{a}" for a in attrs if not hasattr(module, a)]
    from megatron.core.optimizer.cpu_offloading.hybrid_optimizer import HybridDeviceOptimizer

    if not hasattr(HybridDeviceOptimizer, "_get_sub_optimizer_param_groups"):
        missing.append("HybridDeviceOptimizer._get_sub_optimizer_param_groups")
    return missing
