"""Which FP8/FP4 recipes a GPU generation runs (Transformer Engine's datatype support matrix).

``training.fp8`` names one Transformer Engine recipe; whether a GPU runs it depends on its compute
capability alone:
    8.9 (Ada)                    delayed, tensorwise (per-tensor scaling)
    9.0 (Hopper: H100, H200)     delayed, tensorwise, blockwise (DeepSeek-V3's 128x128 blocks)
    10.0, 10.3 (Blackwell DC)    all of them, mxfp8 and nvfp4 included
    12.0 (Blackwell workstation) delayed, tensorwise, blockwise (MXFP8 no, NVFP4 only in part)
    older                        none: FP8 needs 8.9 or newer
A recipe the GPU lacks fails inside Transformer Engine only after every GPU of the job was allocated,
so ``plan`` and ``submit`` (from ``--gpu``) and ``train`` (from the device) refuse it first, in one
sentence naming the recipes that run there.
"""

from __future__ import annotations

from typing import Optional

from megatron_mtp.errors import UserError

_TENSOR = ("tensorwise", "delayed")
SUPPORTED: dict[tuple[int, int], tuple[str, ...]] = {
    (8, 9): _TENSOR,
    (9, 0): ("blockwise",) + _TENSOR,
    (10, 0): ("mxfp8", "nvfp4", "blockwise") + _TENSOR,
    (10, 3): ("mxfp8", "nvfp4", "blockwise") + _TENSOR,
    (12, 0): ("blockwise",) + _TENSOR,
}
"""Compute capability -> the training.fp8 recipes Transformer Engine runs there (best first)."""
ARCH = {(8, 9): "Ada", (9, 0): "Hopper", (10, 0): "Blackwell", (10, 3): "Blackwell", (12, 0): "Blackwell workstation"}


def check_recipe(recipe: Optional[str], capability: Optional[tuple[int, int]], gpu: str) -> None:
    """One sentence when ``gpu`` (of ``capability``; None: unknown, nothing checked) cannot run ``recipe``."""
    if recipe is None or capability is None:
        return
    capability = tuple(capability)
    if capability < (8, 9):
        raise UserError(f"training.fp8={recipe} needs compute capability 8.9 or newer (Ada, Hopper, Blackwell), but "
                        f"the {gpu} is {capability[0]}.{capability[1]}; set training.fp8=null to train in bf16")
    runs = SUPPORTED.get(capability, SUPPORTED[max(k for k in SUPPORTED if k <= capability)])
    if recipe not in runs:
        arch = ARCH.get(capability, f"compute capability {capability[0]}.{capability[1]}")
        raise UserError(f"training.fp8={recipe} does not run on the {gpu} ({arch}, {capability[0]}.{capability[1]}): "
                        f"Transformer Engine runs {recipe} on Blackwell data-center GPUs (10.x); use training.fp8="
                        f"{' or '.join(runs[:2])} there")


def device_capability() -> Optional[tuple[int, int]]:
    """This process's GPU's compute capability (None without one)."""
    import torch

    return tuple(torch.cuda.get_device_capability()) if torch.cuda.is_available() else None
