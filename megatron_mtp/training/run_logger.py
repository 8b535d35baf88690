"""Console lines and TensorBoard scalars (rank 0 only)."""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from pathlib import Path

from megatron_mtp import strict_json


class RunLogger:
    """Console lines, logs/train.log, logs/metrics.jsonl, TensorBoard and W&B, on rank 0.

    A full or failing disk must not end a run from here (the checkpoint path reports it): a write that
    fails is said once on stderr, and that file is given up while the console keeps the lines.
    """

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool, start_step: int = 0, wandb=None):
        """`start_step`: the step the run starts from. What an earlier attempt logged after it (steps it
        trained but never saved, replayed now) is dropped, so each step is in metrics.jsonl and
        TensorBoard once."""
        self.enabled = enabled
        self.wandb = wandb
        """A training.wandb_log.WandbRun (logging.wandb_project) or None."""
        self.writer = None
        self.log_file = self.metrics_file = None
        if enabled:
            (run_dir / "logs").mkdir(parents=True, exist_ok=True)
            self.log_file = open(run_dir / "logs" / "train.log", "a", encoding="utf-8")
            metrics = run_dir / "logs" / "metrics.jsonl"
            _drop_rows_after(metrics, start_step)
            self.metrics_file = open(metrics, "a", encoding="utf-8")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                # purge_step hides the events of steps >= it that earlier attempts wrote
                self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=start_step + 1)

    def _write(self, attr: str, text: str) -> None:
        fh = getattr(self, attr)
        if fh is None:
            return
        try:
            fh.write(text)
            fh.flush()
        except OSError as exc:
            setattr(self, attr, None)
            print(f"megatron-mtp train: warning: cannot write {fh.name} ({exc.strerror}); it is not written "
                  "any more in this run", file=sys.stderr, flush=True)
            with contextlib.suppress(OSError):
                fh.close()

    def info(self, line: str) -> None:
        if not self.enabled:
            return
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        text = f"[{stamp}] {line}"
        print(text, flush=True)
        self._write("log_file", text + "\n")

    def scalars(self, step: int, values: dict[str, float]) -> None:
        """TensorBoard scalars plus one JSON line in logs/metrics.jsonl (for scripts and tests)."""
        if not self.enabled:
            return
        self._write("metrics_file", strict_json.dumps({"step": step, **values}) + "\n")
        if self.wandb is not None:
            self.wandb.log(step, values)
        if self.writer is None:
            return
        try:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        except OSError:
            self.writer = None

    def close(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None
        for fh in (self.writer, self.log_file, self.metrics_file):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()


def _drop_rows_after(path: Path, step: int) -> None:
    """Keep the rows of metrics.jsonl up to `step` (a resume replays the steps after it); atomic."""
    if not path.is_file():
        return
    lines = path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)
    kept = []
    for line in lines:
        try:
            row_step = json.loads(line).get("step", 0)
        except (ValueError, AttributeError):
            continue  # a line cut off by a crash
        if isinstance(row_step, int) and row_step <= step:
            kept.append(line if line.endswith("\n") else line + "\n")
    if len(kept) == len(lines):
        return
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(kept), encoding="utf-8")
    os.replace(tmp, path)


def format_step_line(step: int, max_steps: int, v: dict[str, float], depth: int, frozen_base: bool = False) -> str:
    """The console line of an interval; a frozen base (mtp.freeze_base) trains no router, so its line leaves out the
    MoE balance loss the base does not compute."""
    parts = [
        f"step {step}/{max_steps}",
        f"lm_loss {v['train/lm_loss']:.4f}",
    ]
    for k in range(1, depth + 1):
        parts.append(f"mtp{k}_loss {v[f'train/mtp_loss_{k}']:.4f}")
        parts.append(f"accept{k} {v[f'train/mtp_acceptance_{k}']:.3f}")
    parts += [
        f"λ {v['train/mtp_lambda']:.3g}",
        f"lr {v['train/lr']:.3e}",
        f"grad_norm {v['train/grad_norm']:.3f}",
        f"grad_norm_max {v['train/grad_norm_max']:.3f}",
        f"tok/s {v['perf/tokens_per_s']:.0f}",
        f"TFLOP/s/GPU {v['perf/tflops_per_gpu']:.3g}" + (f" MFU {v['perf/mfu']:.1%}" if "perf/mfu" in v else ""),
        f"step_s {v['perf/step_time_s']:.3f}",
        f"moe_maxvio {v['moe/max_violation']:.3f}",
        *([] if frozen_base else [f"moe_balance {v['moe/balance_loss']:.3f}"]),
        *([f"indexer_loss {v['train/indexer_loss']:.4f}"] if "train/indexer_loss" in v else []),
        f"mem_gib {v['perf/memory_gib']:.2f}",
    ]
    return " | ".join(parts)
