"""One RMSNorm: the training module and the decoder's module compute the same numbers."""

from types import SimpleNamespace

import torch

from megatron_mtp.models.decoding.layers import RMSNorm as DecoderRMSNorm
from megatron_mtp.platform.local_modules import RMSNorm as TrainingRMSNorm


def _pair(dtype: torch.dtype):
    weight = 1 + 0.1 * torch.randn(16, generator=torch.Generator().manual_seed(0))
    training = TrainingRMSNorm(SimpleNamespace(params_dtype=dtype, sequence_parallel=False), 16, eps=1e-6)
    decoder = DecoderRMSNorm(16, 1e-6).to(dtype)
    for norm in (training, decoder):
        norm.weight.data.copy_(weight.to(dtype))
    return training, decoder


def test_training_and_decoder_norms_agree_in_fp32_and_bf16():
    x = torch.randn(3, 16, generator=torch.Generator().manual_seed(1))
    for dtype in (torch.float32, torch.bfloat16):
        training, decoder = _pair(dtype)
        assert torch.equal(training(x.to(dtype)), decoder(x.to(dtype)))
    training, _ = _pair(torch.float32)
    transformers_order = training.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(training(x), transformers_order)  # in fp32 the two orders are the same numbers
