"""Turning logits into the distribution tokens are drawn from: temperature, then top-k, then top-p.

The SAME function shapes the target's p and the draft's q, so the acceptance test compares the
distributions actually sampled from (see verify.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from megatron_mtp.errors import UserError


@dataclass(frozen=True)
class SamplingParams:
    """``temperature == 0`` means greedy (argmax); ``top_k == 0`` and ``top_p == 1`` disable those filters."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise UserError(f"--temperature is {self.temperature}; it must be at least 0 (0 for greedy decoding).")
        if self.top_k < 0:
            raise UserError(f"--top-k is {self.top_k}; it must be at least 0 (0 turns it off).")
        if not 0 < self.top_p <= 1:
            raise UserError(f"--top-p is {self.top_p}; it must be above 0 and at most 1 (1 turns it off).")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def probabilities(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """fp32 distribution over the last dim after temperature, top-k and top-p (in that order)."""
    scores = logits.float() / (params.temperature if params.temperature > 0 else 1.0)
    vocab = scores.shape[-1]
    if 0 < params.top_k < vocab:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = torch.softmax(sorted_scores, dim=-1)
        mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p  # the top token always has mass_before 0: kept
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return torch.softmax(scores, dim=-1)


def draw(probs: torch.Tensor, generator: torch.Generator) -> int:
    """One token from a 1-D distribution."""
    return int(torch.multinomial(probs, 1, generator=generator).item())
