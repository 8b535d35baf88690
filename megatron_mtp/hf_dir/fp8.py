"""Dequantisation of DeepSeek's released FP8 weights (float8_e4m3fn with 128x128 block scales).

Each ``W`` of shape [R, C] comes with ``W_scale_inv`` of shape [ceil(R/128), ceil(C/128)]; block
(i, j) covers rows i*128.. and columns j*128.. (edge blocks are smaller) and the real weight is
``W * scale_inv[i, j]``. The product is computed in fp32, one block row at a time, so the extra
memory is one block row rather than a second full-size scale tensor.
"""

from __future__ import annotations

import math

import torch

from megatron_mtp.errors import UserError

FP8_DTYPES = tuple(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2") if hasattr(torch, name)
)


def dequantize_blockwise(
    weight: torch.Tensor,
    scale_inv: torch.Tensor,
    block: tuple[int, int] = (128, 128),
    out_dtype: torch.dtype = torch.float32,
    name: str = "weight",
) -> torch.Tensor:
    """``weight * scale_inv`` broadcast over ``block``-sized tiles (edge tiles included)."""
    if weight.dim() != 2:
        raise UserError(f"FP8 tensor '{name}' has {weight.dim()} dimensions; block scales need a 2-D weight")
    rows, cols = weight.shape
    br, bc = block
    expected = (math.ceil(rows / br), math.ceil(cols / bc))
    if tuple(scale_inv.shape) != expected:
        raise UserError(
            f"'{name}_scale_inv' has shape {tuple(scale_inv.shape)} but weight {tuple(weight.shape)} with "
            f"{br}x{bc} blocks needs {expected}; the checkpoint's scales do not match its weights"
        )
    scale = scale_inv.to(torch.float32)
    bad = ~(torch.isfinite(scale) & (scale > 0))
    if bool(bad.any()):
        i, j = (int(v) for v in bad.nonzero()[0])
        raise UserError(f"'{name}_scale_inv' holds {float(scale[i, j])!r} for block ({i}, {j}) and FP8 block scales "
                        "must be finite and above 0; the checkpoint's scales are damaged, download it again")
    out = torch.empty((rows, cols), dtype=out_dtype)
    for i in range(expected[0]):
        r0, r1 = i * br, min((i + 1) * br, rows)
        row_scale = scale[i].repeat_interleave(bc)[:cols]
        out[r0:r1] = (weight[r0:r1].to(torch.float32) * row_scale).to(out_dtype)
    return out


def is_block_fp8(quantization_config: dict) -> bool:
    """Whether a config.json's ``quantization_config`` is DeepSeek's FP8 block format, which
    ``HFDir.get`` dequantises (e4m3 weights, one ``weight_scale_inv`` per block)."""
    block = quantization_config.get("weight_block_size")
    return (
        quantization_config.get("quant_method") == "fp8"
        and quantization_config.get("fmt", "e4m3") == "e4m3"
        and isinstance(block, (list, tuple)) and len(block) == 2
        and all(isinstance(b, int) and b > 0 for b in block)
    )
