"""Gemma 4's RoPE, shared by the training attention (models/gemma4/attention.py) and the decoder
(decoder.py); imports only torch.

Rotate-half over the whole head of width d with frequencies θ^(-2i/d) for the first int(share·d/2) pairs
and 0 for the rest (those dimensions pass unrotated): transformers' "default" RoPE when share = 1, its
"proportional" one otherwise (the frequencies keep the whole head's spacing, unlike a partial RoPE over
the first dimensions).
"""

from __future__ import annotations

import torch


def rope_inv_freq(head_dim: int, base: float, share: float, device=None) -> torch.Tensor:
    """The d/2 frequencies: θ^(-2i/d) for the first int(share·d/2), 0 for the others (fp32)."""
    rotated = int(share * head_dim // 2)
    freq = 1.0 / (base ** (torch.arange(0, 2 * rotated, 2, dtype=torch.float32, device=device) / head_dim))
    return torch.cat([freq, torch.zeros(head_dim // 2 - rotated, device=device)])


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    return x * cos + rotate_half(x) * sin


def rope_cos_sin(inv_freq: torch.Tensor, positions: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [len(positions), d] for rotate-half RoPE, computed in fp32 and cast to ``dtype``."""
    freqs = positions.float()[:, None] * inv_freq.to(positions.device)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)
