"""RMSNorm math, shared by the training module (platform/local_modules.py) and the decoder
(models/decoding/layers.py). Imports only torch, so every layer of the package may use it."""

from __future__ import annotations

import torch


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``weight * x / rms(x)`` computed in fp32 and cast back to ``x.dtype`` last.

    The weight multiply happens in fp32 before the cast (megatron-core, Transformer Engine and
    vLLM order; transformers casts first). In fp32 both orders give the same numbers.
    """
    x32 = x.float()
    y = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    return (weight.float() * y).to(x.dtype)
