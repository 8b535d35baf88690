"""Writing DeepSeek-V3's FP8 release format: which tensors are FP8, their block scales, the config.

The release stores the weight of every linear layer inside a decoder layer (attention projections,
the dense MLP, routed and shared experts), in the main model and in the MTP layers alike, as
float8_e4m3fn, each followed by ``<name>_scale_inv``: fp32, one value per 128x128 block, shape
[ceil(rows/128), ceil(cols/128)] (edge blocks are smaller and get their own scale; the weight itself
is not padded). Everything else stays bf16: embeddings, ``lm_head``, norms, the router gate, the MTP
``eh_proj``, ``enorm``/``hnorm`` and ``shared_head``; ``e_score_correction_bias`` stays fp32.
config.json keeps ``torch_dtype: bfloat16`` (the compute dtype) and gains ``quantization_config``.

Quantisation (DeepSeek's rule): per block, ``scale_inv = amax / 448`` (fp32) and the stored value is
``x / scale_inv`` rounded to the nearest e4m3 value; ``weight * scale_inv`` gives the weight back
(convert/fp8.py). The block maximum maps to ±448 exactly, so each value is off by at most half an
e4m3 step at its magnitude: ``|error| <= scale_inv * 2**-4 * 2**floor(log2(|x| / scale_inv))``
(``2**-10`` in the subnormal range), at most ``amax / 16``. An all-zero block gets scale 1.

Re-export is lossless: a block that already is e4m3 values times one fp32 scale (an import of our
own FP8 export) keeps that scale. ``amax / 448`` rounded to fp32 can be one ulp away from it (the
import stored ``448 * scale`` rounded), so the two neighbouring scales are tried for the blocks where
the first one does not give the block's values back exactly; either way the block's error is zero.
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

BLOCK = 128
E4M3_MAX = 448.0
QUANTIZATION_CONFIG = {
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "quant_method": "fp8",
    "weight_block_size": [BLOCK, BLOCK],
}
SCALE_SUFFIX = "_scale_inv"
# the decoder-layer linears the release stores in FP8 (every other tensor stays bf16/fp32)
_FP8_LINEARS = (
    "self_attn.q_a_proj.weight", "self_attn.q_b_proj.weight", "self_attn.q_proj.weight",
    "self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight",
    "gate_proj.weight", "up_proj.weight", "down_proj.weight",
)


def is_fp8_weight(hf_name: str) -> bool:
    """Whether the release stores this tensor in FP8 (``mlp.gate.weight``, the router, is not a match)."""
    return hf_name.endswith(_FP8_LINEARS)


def scale_shape(shape: tuple[int, ...]) -> tuple[int, int]:
    rows, cols = shape
    return math.ceil(rows / BLOCK), math.ceil(cols / BLOCK)


def planned(name: str, shape: tuple[int, ...]) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(name, shape, dtype) of the FP8 weight and of its scale, in the order they are written."""
    return [(name, tuple(shape), torch.float8_e4m3fn), (name + SCALE_SUFFIX, scale_shape(shape), torch.float32)]


def with_quantization(config: dict[str, Any]) -> dict[str, Any]:
    """config.json of an FP8 export: the compute dtype stays bf16, the weights are FP8 blocks."""
    return dict(config, torch_dtype="bfloat16", quantization_config=dict(QUANTIZATION_CONFIG))


def _blocks(x: torch.Tensor) -> torch.Tensor:
    """[R, C] -> [Rb, 128, Cb, 128], zero-padded (zeros change no block maximum)."""
    rows, cols = x.shape
    rb, cb = scale_shape((rows, cols))
    padded = torch.nn.functional.pad(x, (0, cb * BLOCK - cols, 0, rb * BLOCK - rows))
    return padded.view(rb, BLOCK, cb, BLOCK)


def _quantize(blocks: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    per = scale[:, None, :, None]
    return (blocks / per).clamp_(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)


def _reproduces(blocks: torch.Tensor, scale: torch.Tensor, which: torch.Tensor) -> torch.Tensor:
    """Per block (of ``which``): whether quantising with ``scale`` and multiplying back (fp32, as the
    importer does) gives the block exactly. Each block's first row is looked at first, so blocks of
    ordinary weights are ruled out at 1/128 of the cost."""
    def exact(part: torch.Tensor) -> torch.Tensor:
        q = _quantize(part, scale).to(torch.float32)
        return (q * scale[:, None, :, None] == part).all(dim=3).all(dim=1)

    found = which & exact(blocks[:, :1])
    if bool(found.any()):
        found &= exact(blocks)
    return found


def quantize_blockwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, fp32 scale_inv per 128x128 block) of a finite 2-D weight."""
    if weight.dim() != 2:
        raise ValueError(f"block quantisation needs a 2-D weight, not shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    blocks = _blocks(weight.to(torch.float32))
    amax = blocks.abs().amax(dim=3).amax(dim=1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    open_blocks = amax > 0
    for direction in (math.inf, 0.0):  # lossless re-export (module docstring)
        other = torch.nextafter(scale, torch.full_like(scale, direction))
        # the block maximum maps to 448: only a scale that gives it back can give the block back
        candidate = open_blocks & (other * E4M3_MAX == amax)
        if not bool(candidate.any()):
            continue
        candidate &= ~_reproduces(blocks, scale, candidate)
        hit = _reproduces(blocks, other, candidate)
        scale = torch.where(hit, other, scale)
        open_blocks &= ~hit
    q = _quantize(blocks, scale).view(scale.shape[0] * BLOCK, scale.shape[1] * BLOCK)
    return q[:rows, :cols].contiguous(), scale


def quantized(name: str, weight: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The FP8 weight and its scale, named as the release names them."""
    q, scale = quantize_blockwise(weight)
    yield name, q
    yield name + SCALE_SUFFIX, scale
