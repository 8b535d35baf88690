"""`megatron-mtp runs plot RUN`: the run's dashboard as one SVG file, drawn from RUN/logs/metrics.jsonl.

Design note. Six panels, each a few series of the logged scalars against the step: the LM loss (train
and held-out: valid/lm_loss, or eval/lm_loss in older runs), MTP loss per depth, the teacher-forced
acceptance per depth, throughput (tokens/s per GPU, and MFU or TFLOP/s per GPU on its own axis label),
the grad norm (mean and max) and the MoE balance
(max violation, dropped share). The SVG is written by hand (no plotting package): a panel maps the
series' common range onto its box, draws a polyline per series and labels its ends. Values that are
not finite (NaN rows of an interval without a measurement) break a line instead of bending it.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

from megatron_mtp.training.run_summary import HELD_OUT_LOSS, logged_rows

COLORS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b")
PANEL_W, PANEL_H, COLS = 420, 240, 3
PAD_L, PAD_R, PAD_T, PAD_B = 58, 12, 28, 36


def panels(rows: list[dict]) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(legend, metrics key)]) of each panel that has a logged series."""
    depth = max((sum(1 for key in r if key.startswith("train/mtp_loss_")) for r in rows), default=0)
    speed = [("tokens/s per GPU", "perf/tokens_per_s_per_gpu")]
    wanted = [
        ("LM loss", [("train", "train/lm_loss"), *((f"held-out ({key.split('/')[0]})", key) for key in HELD_OUT_LOSS)]),
        ("MTP loss per depth", [(f"depth {k}", f"train/mtp_loss_{k}") for k in range(1, depth + 1)]),
        ("MTP acceptance per depth (teacher-forced)",
         [(f"depth {k}", f"train/mtp_acceptance_{k}") for k in range(1, depth + 1)]),
        ("throughput", speed),
        ("model TFLOP/s per GPU" + (" and MFU" if any("perf/mfu" in r for r in rows) else ""),
         [("TFLOP/s", "perf/tflops_per_gpu")]),
        ("grad norm", [("interval mean", "train/grad_norm"), ("interval max", "train/grad_norm_max")]),
        ("MoE balance", [("max violation", "moe/max_violation"), ("dropped share", "moe/dropped_tokens")]),
    ]
    return [(title, [(n, k) for n, k in series if any(_finite(r.get(k)) for r in rows)])
            for title, series in wanted if any(any(_finite(r.get(k)) for r in rows) for _, k in series)]


def draw(rows: list[dict], title: str) -> str:
    """The SVG text of the dashboard of `rows` (metrics.jsonl rows, eval rows included)."""
    chosen = panels(rows)
    n_rows = max(1, math.ceil(len(chosen) / COLS))
    width, height = PANEL_W * COLS, PANEL_H * n_rows + 30
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
           f'<rect width="{width}" height="{height}" fill="white"/>',
           f'<text x="10" y="19" font-size="14" font-weight="bold">{html.escape(title)}</text>']
    for i, (name, series) in enumerate(chosen):
        x0, y0 = (i % COLS) * PANEL_W, 30 + (i // COLS) * PANEL_H
        out.extend(_panel(rows, name, series, x0, y0))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def _panel(rows, name, series, x0, y0) -> list[str]:
    points = {key: [(r["step"], r[key]) for r in rows if _finite(r.get(key)) and "step" in r] for _, key in series}
    xs = [x for pts in points.values() for x, _ in pts]
    ys = [y for pts in points.values() for _, y in pts]
    (xa, xb), (ya, yb) = _span(min(xs), max(xs)), _span(min(ys), max(ys))
    left, right, top, bottom = x0 + PAD_L, x0 + PANEL_W - PAD_R, y0 + PAD_T, y0 + PANEL_H - PAD_B

    def at(x, y):
        return (left + (x - xa) / (xb - xa) * (right - left), bottom - (y - ya) / (yb - ya) * (bottom - top))

    out = [f'<text x="{x0 + PAD_L}" y="{y0 + 16}" font-weight="bold">{html.escape(name)}</text>',
           f'<rect x="{left}" y="{top}" width="{right - left}" height="{bottom - top}" fill="none" stroke="#999"/>',
           f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_label(yb)}</text>',
           f'<text x="{left - 4}" y="{bottom}" text-anchor="end">{_label(ya)}</text>',
           f'<text x="{left}" y="{bottom + 14}">{_label(xa)}</text>',
           f'<text x="{right}" y="{bottom + 14}" text-anchor="end">step {_label(xb)}</text>']
    for j, (legend, key) in enumerate(series):
        color = COLORS[j % len(COLORS)]
        for run in _runs(rows, key):
            coords = " ".join(f"{px:.1f},{py:.1f}" for px, py in (at(x, y) for x, y in run))
            if len(run) == 1:
                px, py = at(*run[0])
                out.append(f'<circle cx="{px:.1f}" cy="{py:.1f}" r="2.5" fill="{color}"/>')
            else:
                out.append(f'<polyline points="{coords}" fill="none" stroke="{color}" stroke-width="1.5"/>')
        out.append(f'<text x="{left + 6 + 110 * j}" y="{bottom + 28}" fill="{color}">{html.escape(legend)}</text>')
    return out


def _runs(rows, key) -> list[list[tuple[float, float]]]:
    """The series of `key` split where a row has no finite value (a gap, not a line across it)."""
    runs, current = [], []
    for r in rows:
        if key not in r or "step" not in r:
            continue
        if _finite(r[key]):
            current.append((r["step"], r[key]))
        elif current:
            runs.append(current)
            current = []
    return runs + ([current] if current else [])


def _span(lo: float, hi: float) -> tuple[float, float]:
    if hi > lo:
        return lo, hi
    pad = abs(lo) * 0.05 or 1.0
    return lo - pad, hi + pad


def _label(v: float) -> str:
    return f"{v:,.0f}" if abs(v) >= 1000 else f"{v:.4g}"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def plot_run(run_dir: Path, out: Path | None) -> Path:
    """Write the dashboard of the run in `run_dir` to `out` (default RUN/logs/dashboard.svg)."""
    from megatron_mtp.output import write_text_atomic

    rows, _ = logged_rows(run_dir)
    out = out or run_dir / "logs" / "dashboard.svg"
    write_text_atomic(out, draw(rows, f"{run_dir.resolve().name}: {rows[-1].get('step', 0)} steps"),
                      what="the dashboard")
    return out
