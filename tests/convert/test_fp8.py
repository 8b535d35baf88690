"""FP8 128x128 block dequantisation against a direct per-block reference (edge blocks included)."""

import math

import pytest
import torch

from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.fp8 import dequantize_blockwise

pytestmark = pytest.mark.skipif(not hasattr(torch, "float8_e4m3fn"), reason="torch without float8")


def _reference(weight: torch.Tensor, scale: torch.Tensor, block: int) -> torch.Tensor:
    out = torch.empty(weight.shape, dtype=torch.float32)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            rows = slice(i * block, (i + 1) * block)
            cols = slice(j * block, (j + 1) * block)
            out[rows, cols] = weight[rows, cols].float() * scale[i, j].item()
    return out


@pytest.mark.parametrize("shape", [(300, 200), (128, 128), (129, 257), (5, 3)])
def test_blockwise_matches_reference(shape):
    g = torch.Generator().manual_seed(sum(shape))
    weight = (torch.randn(shape, generator=g) * 3).to(torch.float8_e4m3fn)
    scale = torch.rand((math.ceil(shape[0] / 128), math.ceil(shape[1] / 128)), generator=g) + 0.01
    got = dequantize_blockwise(weight, scale)
    assert torch.equal(got, _reference(weight, scale, 128))
    # every block really used its own scale (distinct scales, so a shifted tiling would differ)
    if scale.numel() > 1:
        assert not torch.equal(got, weight.float() * scale[0, 0])


def test_bf16_output_and_small_blocks():
    weight = torch.randn(10, 7).to(torch.float8_e4m3fn)
    scale = torch.arange(1, 1 + 3 * 2, dtype=torch.float32).reshape(3, 2)
    got = dequantize_blockwise(weight, scale, block=(4, 4), out_dtype=torch.bfloat16)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _reference(weight, scale, 4).to(torch.bfloat16))


def test_scale_shape_mismatch_is_an_error():
    weight = torch.zeros(300, 200).to(torch.float8_e4m3fn)
    with pytest.raises(UserError, match="scale_inv"):
        dequantize_blockwise(weight, torch.ones(2, 2), name="w")
