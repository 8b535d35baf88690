"""Which chunks of a sequence a context-parallel rank holds (models/context_parallel.py has the design
note); plain Python, so the batch split can import it before megatron-core is loaded."""

from __future__ import annotations


def chunk_order(rank: int, cp: int) -> tuple[int, int]:
    """The two chunks (of 2·cp) of every sequence that context-parallel rank ``rank`` holds: rank and
    2·cp - 1 - rank (megatron-core's load-balanced split: causal attention costs every rank alike)."""
    return rank, 2 * cp - 1 - rank


def local_positions(local: int, rank: int, cp: int) -> list[int]:
    """The sequence positions of the ``local`` tokens context-parallel rank ``rank`` holds: its two chunks
    (``chunk_order``) of ``local // 2`` tokens each, one after the other."""
    chunk = local // 2
    a, b = chunk_order(rank, cp)
    return [*range(a * chunk, (a + 1) * chunk), *range(b * chunk, (b + 1) * chunk)]
