"""Which chunks of a sequence a context-parallel rank holds (models/context_parallel.py has the design
note); plain Python, so the batch split can import it before megatron-core is loaded."""

from __future__ import annotations


def chunk_order(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2·cp) of every sequence that context-parallel rank ``rank`` holds: rank and
    2·cp - 1 - rank (megatron-core's load-balanced split: causal attention costs every rank alike)."""
    return rank, 2 * cp - 1 - rank
