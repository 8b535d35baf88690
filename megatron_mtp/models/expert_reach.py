"""How many routed experts a forward of T tokens reaches: what decides the expert-weight bytes it reads.

Shared by `plan --speculative` (the prediction) and the decoder's expert counts (the measurement
beside it), so both use one expectation.
"""

from __future__ import annotations


def distinct_experts(num_experts: int, topk: int, tokens: int) -> float:
    """Expected distinct experts T tokens route to under uniform top-k routing: E·(1−(1−k/E)^T)."""
    if num_experts == 0:
        return 0.0
    return num_experts * (1.0 - (1.0 - topk / num_experts) ** tokens)
