"""Comparing the scalars two runs logged (metrics.jsonl rows): every logged scalar but the timings
(perf/*, time/*)."""

from __future__ import annotations

DEFAULT_TOLERANCE = 2e-3


def values(rows: list[dict], key: str) -> list[float]:
    return [r[key] for r in rows if key in r]


def compare_scalars(got_rows: list[dict], want_rows: list[dict], what: str, tolerance: dict) -> list[str]:
    """Assert that `got_rows` logged every scalar of `want_rows` (step, perf/* and time/* aside) as often and
    within `tolerance[key]` (default 2e-3) at every logged step; returns the keys compared."""
    keys = sorted({k for r in want_rows for k in r if k != "step" and not k.startswith(("perf/", "time/"))})
    for key in keys:
        got, want = values(got_rows, key), values(want_rows, key)
        assert len(got) == len(want) > 0, (what, key, len(got), len(want))
        assert max(abs(a - b) for a, b in zip(got, want)) < _tolerance(tolerance, key), (what, key, got, want)
    return keys


def _tolerance(tolerance: dict, key: str) -> float:
    if key in tolerance:
        return tolerance[key]
    if key.startswith("moe/imbalance/"):  # one layer's max/mean: the logged mean's tolerance, twice (not averaged)
        return 2 * tolerance.get("moe/max_violation", DEFAULT_TOLERANCE)
    return DEFAULT_TOLERANCE
