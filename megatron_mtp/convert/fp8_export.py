"""Writing DeepSeek-V3's FP8 release format: which tensors are FP8, their block scales, the config.

The release stores the weight of every linear layer inside a decoder layer (attention projections,
the dense MLP, routed and shared experts), in the main model and in the MTP layers alike, as
float8_e4m3fn, each followed by ``<name>_scale_inv``: fp32, one value per 128x128 block, shape
[ceil(rows/128), ceil(cols/128)] (edge blocks are smaller and get their own scale; the weight itself
is not padded). Everything else stays bf16: embeddings, ``lm_head``, norms, the router gate, the MTP
``eh_proj``, ``enorm``/``hnorm``, ``shared_head`` and the DSA indexer's ``weights_proj``;
``e_score_correction_bias`` stays fp32.
config.json keeps ``torch_dtype: bfloat16`` (the compute dtype) and gains ``quantization_config``.

Quantisation (DeepSeek's rule): per block, ``scale_inv = amax / 448`` (fp32) and the stored value is
``x / scale_inv`` rounded to the nearest e4m3 value; ``weight * scale_inv`` gives the weight back
(hf_dir/fp8.py). The block maximum maps to ±448 exactly, so each value is off by at most half an
e4m3 step at its magnitude: ``|error| <= scale_inv * 2**-4 * 2**floor(log2(|x| / scale_inv))``
(``2**-10`` in the subnormal range), at most ``amax / 16``. An all-zero block gets scale 1.

Re-export is lossless. An import stores ``q * scale`` in fp32, so a block's largest value comes back as
``fl(448 * scale)``, and ``fl(fl(448 * scale) / 448) == scale`` for every ``scale = fl(amax / 448)``
(checked over every fp32 mantissa of several exponents); each ``fl(q * scale) / scale`` then rounds
back to ``q``. So FP8 -> import -> FP8 gives the same bytes (tested), with no special case.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Iterator, Optional

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


@functools.lru_cache(maxsize=None)
def fp8_linears() -> tuple[str, ...]:
    """Name endings of the decoder-layer linear weights the release stores in FP8, from every family's
    tensor table: the weights of megatron-core ``linear_*`` modules of the attention and MLP blocks
    (not their biases or fused norms, not the router, not the MTP module's ``eh_proj``, not the DSA indexer's
    ``weights_proj``: vLLM fuses it unquantised with ``wk`` and SGLang builds it in bf16, so neither reads an FP8
    one, and transformers keeps it in fp32)."""
    from megatron_mtp.models.family import families
    from megatron_mtp.models.tensor_table import DENSE_MLP, MOE_MLP

    out: set[str] = set()
    for family in families():
        for rule in (*family.table.attention, *DENSE_MLP, *MOE_MLP):
            module, leaf = rule.mcore.rsplit(".", 2)[-2:]
            if module.startswith("linear_") and leaf == "weight" and rule.role == "weight":
                out.update(h.rsplit("{e}.", 1)[-1] for h in rule.hf if not h.endswith("weights_proj.weight"))
    return tuple(sorted(out))


def is_fp8_weight(hf_name: str) -> bool:
    """Whether the release stores this tensor in FP8 (``mlp.gate.weight``, the router, is not a match)."""
    return hf_name.endswith(fp8_linears())


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


def quantize_blockwise(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(float8_e4m3fn weight, fp32 scale_inv per 128x128 block) of a finite 2-D weight."""
    if weight.dim() != 2:
        raise ValueError(f"block quantisation needs a 2-D weight, not shape {tuple(weight.shape)}")
    rows, cols = weight.shape
    blocks = _blocks(weight.to(torch.float32))
    amax = blocks.abs().amax(dim=3).amax(dim=1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    q = _quantize(blocks, scale).view(scale.shape[0] * BLOCK, scale.shape[1] * BLOCK)
    return q[:rows, :cols].contiguous(), scale


def quantized(name: str, weight: torch.Tensor) -> Iterator[tuple[str, torch.Tensor]]:
    """The FP8 weight and its scale, named as the release names them."""
    q, scale = quantize_blockwise(weight)
    yield name, q
    yield name + SCALE_SUFFIX, scale


def cpu_dequant_note(planned_tensors: list) -> Optional[str]:
    """The warning for an export that transformers would dequantise wrongly on a CPU, or None.

    transformers 5.24 dequantises FP8 blocks on a CPU with a block size derived from the scale grid
    (``rows // scale_rows``), which is the real 128 only where a dimension is a multiple of 128 or fits
    one block (convert/README.md, "FP8 export")."""
    for t in planned_tensors:
        if t.dtype != torch.float8_e4m3fn:
            continue
        for size in t.shape:
            if size > BLOCK and size % BLOCK:
                return (f"transformers dequantises FP8 blocks on a CPU with a block size derived from the scale "
                        f"grid, which is wrong for '{t.name}' ({size} is not a multiple of {BLOCK}); load this "
                        "export in transformers on a GPU, or export it with --dtype bf16 for a CPU")
    return None
