"""A run in a few lines: what `train` prints when it finishes and `megatron-mtp runs show RUN` prints
at any time (from RUN/logs/metrics.jsonl, the run's checkpoints, and whether RUN/config.yaml froze the base:
a frozen base's LM loss is the loaded model's, not trained, so it has no best)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from megatron_mtp.config.mtp_style import find_style
from megatron_mtp.errors import UserError

RECENT = 10
"""Throughput is the mean of the last RECENT logged intervals (the first ones include start-up)."""
HELD_OUT_LOSS = ("valid/lm_loss", "eval/lm_loss")
"""The held-out LM loss's key: what the trainer's evaluation logs, then the name runs logged before it."""


def held_out_loss(row: dict):
    """A row's held-out LM loss (a finite number) or None."""
    return next((row[key] for key in HELD_OUT_LOSS if _finite(row.get(key))), None)


def logged_rows(run_dir: Path) -> tuple[list[dict], list[dict]]:
    """Every row of RUN/logs/metrics.jsonl, and the training rows with a finite loss (a UserError when
    there are none)."""
    metrics = run_dir / "logs" / "metrics.jsonl"
    if not metrics.is_file():
        raise UserError(f"'{run_dir}' has no logs/metrics.jsonl: it is not a run directory, or it has not logged a "
                        "step yet; give the --run-dir of a training run")
    rows = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    train = [r for r in rows if "train/lm_loss" in r and _finite(r["train/lm_loss"])]
    if not train:
        raise UserError(f"'{run_dir}' has logged no training step yet; run `megatron-mtp train` there first")
    return rows, train


def summarize(run_dir: Path) -> dict[str, Any]:
    """The summary of the run in `run_dir` (a UserError when it has logged nothing)."""
    from megatron_mtp.checkpoint.run_dir import complete_steps

    rows, train = logged_rows(run_dir)
    last, recent = train[-1], train[-RECENT:]
    depth = sum(1 for key in last if key.startswith("train/mtp_loss_"))
    frozen = frozen_base(run_dir)
    best = None if frozen else min(train, key=lambda r: r["train/lm_loss"])
    evals = [loss for loss in map(held_out_loss, rows) if loss is not None]
    steps = complete_steps(run_dir / "checkpoints") if (run_dir / "checkpoints").is_dir() else []
    return {
        "run_dir": str(run_dir),
        "step": last["step"],
        "consumed_tokens": int(last.get("progress/consumed_tokens", 0)),
        "train_seconds": _step_seconds(train),
        "lm_loss": last["train/lm_loss"],
        "frozen_base": frozen,
        "best_lm_loss": best and best["train/lm_loss"], "best_step": best and best["step"],
        "eval_lm_loss": evals[-1] if evals else None,
        "mtp_loss": [last.get(f"train/mtp_loss_{k}") for k in range(1, depth + 1)],
        "mtp_acceptance": [_last_finite(train, f"train/mtp_acceptance_{k}") for k in range(1, depth + 1)],
        "tokens_per_s_per_gpu": _mean(recent, "perf/tokens_per_s_per_gpu"),
        "tflops_per_gpu": _mean(recent, "perf/tflops_per_gpu"),
        "mfu": _mean(recent, "perf/mfu"),
        "skipped_steps": sum(int(r.get("train/skipped_steps", 0)) for r in rows),
        "checkpoints": [p.name for p in steps],
    }


def format_summary(s: dict[str, Any]) -> str:
    mtp = "  ".join(f"depth {k}: loss {loss:.4f}, acceptance {acc:.3f}" for k, (loss, acc)
                    in enumerate(zip(s["mtp_loss"], s["mtp_acceptance"]), 1) if loss is not None and acc is not None)
    speed = f"{s['tokens_per_s_per_gpu']:,.0f} tokens/s per GPU, {s['tflops_per_gpu']:.3g} TFLOP/s per GPU"
    if s["mfu"] is not None:
        speed += f", MFU {s['mfu']:.1%}"
    hours = f" in {_duration(s['train_seconds'])} of steps"
    lines = [
        f"run {s['run_dir']}: step {s['step']}, {s['consumed_tokens']:,} tokens{hours}",
        f"  lm loss {s['lm_loss']:.4f} "
        + ("(the frozen base's, not trained)" if s["frozen_base"]
           else f"(best {s['best_lm_loss']:.4f} at step {s['best_step']})")
        + (f", held-out {s['eval_lm_loss']:.4f}" if s["eval_lm_loss"] is not None else ""),
    ]
    if mtp:
        lines.append(f"  MTP {mtp}")
    lines.append(f"  throughput (last {RECENT} intervals): {speed}")
    kept = ", ".join(s["checkpoints"]) or "none"
    lines.append(f"  checkpoints: {kept}" + (f"; {s['skipped_steps']} steps skipped" if s["skipped_steps"] else ""))
    return "\n".join(lines)


def frozen_base(run_dir: Path) -> bool:
    """Whether the run's config.yaml trains on a frozen base (mtp.freeze_base; an assistant always does)."""
    import yaml

    try:
        saved = yaml.safe_load((run_dir / "config.yaml").read_text()) or {}
    except (OSError, yaml.YAMLError):  # none (yet), or not ours
        return False
    mtp = saved.get("mtp") or {} if isinstance(saved, dict) else {}
    style = find_style(mtp.get("style")) if isinstance(mtp.get("style"), str) else None
    drafter = style is not None and style.separate_drafter  # it always trains on a frozen base
    return bool(mtp.get("freeze_base")) or (drafter and bool(mtp.get("num_layers")))


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    return f"{seconds / 60:.1f} min" if seconds < 7200 else f"{seconds / 3600:.2f} h"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _mean(rows: list[dict], key: str):
    values = [r[key] for r in rows if _finite(r.get(key))]
    return sum(values) / len(values) if values else None


def _last_finite(rows: list[dict], key: str):
    for row in reversed(rows):
        if _finite(row.get(key)):
            return row[key]
    return None


def _step_seconds(rows: list[dict]) -> float:
    """The time of the logged steps: each interval's mean step time times its steps."""
    total, before = 0.0, 0
    for row in rows:
        total += row.get("perf/step_time_s", 0.0) * (row["step"] - before)
        before = row["step"]
    return total
