"""Console lines and TensorBoard scalars (rank 0 only)."""

from __future__ import annotations

import contextlib
import sys
import time
from pathlib import Path

from megatron_mtp import strict_json


class RunLogger:
    """Console lines, logs/train.log, logs/metrics.jsonl and TensorBoard, on rank 0.

    A full or failing disk must not end a run from here (the checkpoint path reports it): a write that
    fails is said once on stderr, and that file is given up while the console keeps the lines.
    """

    def __init__(self, run_dir: Path, enabled: bool, tensorboard: bool):
        self.enabled = enabled
        self.writer = None
        self.log_file = self.metrics_file = None
        if enabled:
            (run_dir / "logs").mkdir(parents=True, exist_ok=True)
            self.log_file = open(run_dir / "logs" / "train.log", "a", encoding="utf-8")
            self.metrics_file = open(run_dir / "logs" / "metrics.jsonl", "a", encoding="utf-8")
            if tensorboard:
                from torch.utils.tensorboard import SummaryWriter

                self.writer = SummaryWriter(log_dir=str(run_dir / "tensorboard"))

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
        if self.writer is None:
            return
        try:
            for key, value in values.items():
                self.writer.add_scalar(key, value, step)
            self.writer.flush()
        except OSError:
            self.writer = None

    def close(self) -> None:
        for fh in (self.writer, self.log_file, self.metrics_file):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()


def format_step_line(step: int, max_steps: int, v: dict[str, float], depth: int) -> str:
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
        f"tok/s {v['perf/tokens_per_s']:.0f}",
        f"step_s {v['perf/step_time_s']:.3f}",
        f"moe_maxvio {v['moe/max_violation']:.3f}",
        f"moe_balance {v['moe/balance_loss']:.3f}",
        f"mem_gib {v['perf/memory_gib']:.2f}",
    ]
    return " | ".join(parts)
