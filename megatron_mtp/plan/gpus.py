"""GPU memory capacities the plan checks a layout against."""

from __future__ import annotations

from dataclasses import dataclass

from megatron_mtp.errors import UserError

GIB = 1024**3


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int
    """Memory the device reports (what torch.cuda.mem_get_info sees as total on an idle GPU)."""
    bf16_tflops: float = 0.0
    """Dense bf16 tensor-core peak (data sheet, SXM); 0: unknown (no time estimate)."""
    fp8_tflops: float = 0.0
    hbm_bytes_per_s: float = 0.0
    """Memory bandwidth (data sheet, SXM); 0: unknown (no decoding-speed prediction)."""
    capability: tuple[int, int] | None = None
    """CUDA compute capability (which FP8/FP4 recipes it runs: platform/low_precision.py); None: unknown."""


# Names use the decimal GB of the data sheets; the capacity is what the device reports (nvidia-smi
# total: H100 SXM 81,559 MiB, H200 143,771 MiB, B200 183,359 MiB).
KNOWN = {
    "h100": Gpu("H100 80 GB", 81559 * 1024**2, 989.0, 1979.0, 3.35e12, (9, 0)),
    "h200": Gpu("H200 141 GB", 143771 * 1024**2, 989.0, 1979.0, 4.8e12, (9, 0)),
    "b200": Gpu("B200 192 GB", 183359 * 1024**2, 2250.0, 4500.0, 8.0e12, (10, 0)),
}
DEFAULT = "h100"


def parse_gpu(text: str | None) -> Gpu:
    """'h100', 'h200', 'b200' or a number of GiB ('96', '96GiB')."""
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
