"""GPU data sheets: the memory the plan checks a layout against and the dense peaks MFU is measured by."""

from __future__ import annotations

import re
from dataclasses import dataclass

from megatron_mtp.errors import UserError

GIB = 1024**3
FIXED_ALLOWANCE = 3 * GIB
"""CUDA context (~0.5 GiB), NCCL communicators and buffers, cuBLAS/TE workspaces, allocator slack: what a GPU
rank holds beside its tensors (the plan's workspace)."""


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    """Memory the device reports (what torch.cuda.mem_get_info sees as total on an idle GPU)."""
    bf16_tflops: float = 0.0
    """Dense (not 2:4 sparse) bf16 tensor-core peak of this form factor's data sheet; 0: unknown (no time
    estimate, no MFU)."""
    fp8_tflops: float = 0.0
    """Dense FP8 tensor-core peak (twice the bf16 one on every GPU here)."""
    hbm_bytes_per_s: float = 0.0
    """Memory bandwidth (data sheet); 0: unknown (no decoding-speed prediction)."""
    capability: tuple[int, int] | None = None
    """CUDA compute capability (which FP8/FP4 recipes it runs: platform/low_precision.py); None: unknown."""


# Names use the decimal GB of the data sheets; the capacity is what the device reports (nvidia-smi
# total: H100 SXM and PCIe 81,559 MiB, H100 NVL 95,830 MiB, H200 143,771 MiB, B200 183,359 MiB, GB200
# 189,471 MiB). Peaks are the data sheets' sparse figures halved: H100 PCIe and NVL run lower clocks and
# power than the SXM part; a GB200's B200 runs at up to 1,200 W against the HGX B200's 1,000 W.
KNOWN = {
    "h100": Gpu("H100 80 GB", 81559 * 1024**2, 989.0, 1979.0, 3.35e12, (9, 0)),
    "h100-pcie": Gpu("H100 PCIe 80 GB", 81559 * 1024**2, 756.0, 1513.0, 2.0e12, (9, 0)),
    "h100-nvl": Gpu("H100 NVL 94 GB", 95830 * 1024**2, 835.0, 1670.0, 3.9e12, (9, 0)),
    "h200": Gpu("H200 141 GB", 143771 * 1024**2, 989.0, 1979.0, 4.8e12, (9, 0)),
    "b200": Gpu("B200 192 GB", 183359 * 1024**2, 2250.0, 4500.0, 8.0e12, (10, 0)),
    "gb200": Gpu("GB200 186 GB", 189471 * 1024**2, 2500.0, 5000.0, 8.0e12, (10, 0)),
}
DEVICE_NAMES = {
    "h100": r"H100( 80GB HBM3| SXM5? 80GB)?",
    "h100-pcie": r"H100 PCIe",
    "h100-nvl": r"H100 NVL",
    "h200": r"H200( 141GB HBM3e)?",
    "b200": r"B200",
    "gb200": r"GB200",
}
"""The CUDA device names (torch.cuda.get_device_name, after "NVIDIA ") of each entry, matched whole: a
name no pattern matches (H200 NVL, GH200, H800, ...) is an unknown GPU, not the nearest-sounding one."""


def gpu_of_device(name: str) -> Gpu | None:
    """The table's GPU for a CUDA device name ('NVIDIA H100 80GB HBM3' -> H100), None if it is not known."""
    bare = name.strip().removeprefix("NVIDIA ").strip()
    return next((KNOWN[key] for key, pattern in DEVICE_NAMES.items()
                 if re.fullmatch(pattern, bare, flags=re.IGNORECASE)), None)


DEFAULT = "h100"


def parse_gpu(text: str | None) -> Gpu:
    """A key of KNOWN ('h100', 'h100-pcie', 'h200', ...) or a number of GiB ('96', '96GiB')."""
    key = (text or DEFAULT).strip().lower()
    if key in KNOWN:
        return KNOWN[key]
    number = key.removesuffix("gib").removesuffix("g").strip()
    try:
        gib = float(number)
    except ValueError:
        gib = 0.0
    if gib > 0:
        return Gpu(f"{gib:g} GiB GPU", int(gib * GIB))
    raise UserError(f"--gpu {text!r} is not a GPU the plan knows; use one of {', '.join(KNOWN)} or a memory "
                    "size in GiB (e.g. --gpu 96)")
