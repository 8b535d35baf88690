"""Micro-batches each pipeline rank holds in flight under megatron-core 0.16.1's schedules.

A forward pass keeps its activations until that micro-batch's backward on the same chunk. The
schedules (pipeline_parallel/schedules.py) run, on pipeline rank r of p with m micro-batches:
  1F1B (no virtual pipeline): w = min(p - r - 1, m) warm-up forwards, then one forward and one
      backward at a time, then the remaining backwards;
  interleaved (v chunks per rank): w = min(2 (p - r - 1) + (v - 1) g [+ 1 with the expert-parallel
      all-to-all overlap], m v) warm-up forwards over (micro-batch, chunk) in the schedule table
      (groups of g = p micro-batches per chunk), then forward/backward pairs; backward k works on
      the chunks in reverse order (chunk v - 1 - c of table entry k);
  no pipeline: one micro-batch at a time.
`peak` replays that order and returns what is live when the weighted sum is largest. After the
warm-up the live (micro-batch, chunk) pairs repeat with a period of p × v table entries (whole groups
of p micro-batches), and the cool-down only frees, so a replay of enough whole groups to cover the
warm-up and two periods has the same peak as one of thousands of micro-batches (`_replayed`).
"""

from __future__ import annotations

from dataclasses import dataclass


def schedule_table(num_micro: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(micro-batch, chunk) of each virtual micro-batch, in forward order."""
    table = []
    for first in range(0, num_micro, group):
        last = num_micro if first + group >= num_micro else first + group
        table += [(mb, c) for c in range(chunks) for mb in range(first, last)]
    return table


def warmup(pp: int, rank: int, chunks: int, num_micro: int, a2a_overlap: bool = False) -> int:
    total = num_micro * chunks
    if pp == 1:
        return 0
    if chunks == 1:
        w = pp - rank - 1
    else:
        w = 2 * (pp - rank - 1) + (chunks - 1) * pp + (1 if a2a_overlap else 0)
    return min(w, total)


def events(pp: int, rank: int, chunks: int, num_micro: int, a2a_overlap: bool = False) -> list[tuple[str, int, int]]:
    """('F' | 'B', micro-batch, chunk) in the order the rank runs them."""
    table = schedule_table(num_micro, chunks, pp)
    forward = table
    backward = [(mb, chunks - 1 - c) for mb, c in table]
    w = warmup(pp, rank, chunks, num_micro, a2a_overlap)
    out = [("F", *forward[i]) for i in range(w)]
    for k in range(len(table) - w):
        out += [("F", *forward[w + k]), ("B", *backward[k])]
    out += [("B", *backward[k]) for k in range(len(table) - w, len(table))]
    return out


@dataclass(frozen=True)
class Peak:
    in_flight: int
    """(micro-batch, chunk) forwards alive at the peak."""
    per_chunk: tuple[int, ...]
    """How many of them each chunk holds."""
    bytes: float
    """Their summed weight."""


def peak(pp: int, rank: int, chunks: int, num_micro: int, weights: list[float] | None = None,
         a2a_overlap: bool = False) -> Peak:
    """The moment the live forwards weigh most (weights: bytes per chunk; default 1 each)."""
    weights = weights or [1.0] * chunks
    live = [0] * chunks
    best = Peak(0, tuple(live), 0.0)
    for kind, _, chunk in events(pp, rank, chunks, _replayed(pp, rank, chunks, num_micro, a2a_overlap), a2a_overlap):
        live[chunk] += 1 if kind == "F" else -1
        total = sum(n * w for n, w in zip(live, weights))
        if total > best.bytes or (total == best.bytes and sum(live) > best.in_flight):
            best = Peak(sum(live), tuple(live), total)
    return best


def _replayed(pp: int, rank: int, chunks: int, num_micro: int, a2a_overlap: bool) -> int:
    """Micro-batches `peak` replays: all of them, or whole groups covering the warm-up and two periods
    (a periodic steady state; whole groups only where every group is whole or there is one chunk)."""
    if chunks > 1 and num_micro % pp:
        return num_micro
    period = pp * chunks
    w = warmup(pp, rank, chunks, num_micro, a2a_overlap)
    enough = pp * (-(-(w + 2 * period) // period) + 1)
    return min(num_micro, enough)


def forward_only_peak(weights: list[float]) -> Peak:
    """A forward-only schedule whose loss back-propagates each micro-batch at once (mtp.freeze_base):
    at most one micro-batch's graph alive, on the heaviest chunk."""
    if not any(weights):
        return Peak(0, tuple(0 for _ in weights), 0.0)
    heaviest = max(range(len(weights)), key=lambda i: weights[i])
    return Peak(1, tuple(int(i == heaviest) for i in range(len(weights))), weights[heaviest])


def max_in_flight(pp: int, rank: int, chunks: int, num_micro: int, a2a_overlap: bool = False) -> int:
    """The most forwards alive at once (closed form of the replay: warm-up + 1, at most all)."""
    return min(warmup(pp, rank, chunks, num_micro, a2a_overlap) + 1, num_micro * chunks)


def bubble_fraction(pp: int, chunks: int, num_micro: int) -> float:
    """Idle share of a step with equal-time chunks: (p - 1) / (v m + p - 1)."""
    return (pp - 1) / (chunks * num_micro + pp - 1)
