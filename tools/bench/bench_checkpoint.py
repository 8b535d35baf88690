"""Checkpoint cost: save time, and the training time a save takes away, synchronous vs in the background.

Three real training runs of the same model (`megatron-mtp train`, one process or --nproc): no saves,
a synchronous save every --every steps, and a background save every --every steps. From each run's
metrics.jsonl and wall time: the median step time, the save time reported by the trainer
(perf/checkpoint_save_s: from the start of the save until it is published), and the time lost per
save = (wall time with saves - wall time without) / number of saves. Ratios are printed against the
synchronous save.

    .venv/bin/python tools/bench/bench_checkpoint.py [--steps 12] [--every 3] [--hidden 512] [--nproc 1]
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(run_dir: Path, args, *overrides: str) -> tuple[float, list[dict]]:
    h = args.hidden
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--run-dir",
           str(run_dir), "--max-steps", str(args.steps), f"model.hidden_size={h}", f"model.ffn_hidden_size={3 * h}",
           f"model.moe_ffn_hidden_size={3 * h // 4}", "training.seq_length=256", "training.micro_batch_size=2",
           f"training.global_batch_size={2 * args.nproc}", "logging.log_interval=1", "logging.tensorboard=false",
           "checkpoint.keep_last=0", *overrides]
    if args.nproc > 1:
        cmd += ["--nproc-per-node", str(args.nproc), "parallel.expert=2"]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // args.nproc)), PYTHONWARNINGS="ignore")
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
    if proc.returncode:
        raise SystemExit(proc.stderr[-3000:])
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return time.perf_counter() - start, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--every", type=int, default=3)
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--nproc", type=int, default=1)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)  # several checkpoints of ~0.5 GiB each
    saves = args.steps // args.every
    results = {}
    for name, overrides in (("none", ("checkpoint.save_interval=0",)),
                            ("sync", (f"checkpoint.save_interval={args.every}", "checkpoint.async_save=false")),
                            ("async", (f"checkpoint.save_interval={args.every}", "checkpoint.async_save=true"))):
        wall, rows = run(work / name, args, *overrides)
        steps = [r["perf/step_time_s"] for r in rows if "perf/step_time_s" in r][1:]
        save_s = [r["perf/checkpoint_save_s"] for r in rows if "perf/checkpoint_save_s" in r]
        results[name] = (wall, statistics.median(steps), statistics.median(save_s) if save_s else 0.0)
    size = sum(f.stat().st_size for f in (work / "sync" / "checkpoints").glob("step_*/**/*") if f.is_file()) / saves
    print(f"model hidden {args.hidden}, {args.nproc} process(es), {args.steps} steps, a save every {args.every} "
          f"({saves} saves, {size / 2**20:.0f} MiB each); the last save of a run is waited for at its end")
    base = results["none"][0]
    lost = {name: (results[name][0] - base) / saves for name in ("sync", "async")}
    for name, (wall, step, save) in results.items():
        extra = f"   lost per save {lost[name]:6.2f} s" if name in lost else ""
        print(f"{name:6s} wall {wall:7.2f} s   median step {step * 1e3:7.1f} ms   save {save:6.2f} s{extra}")
    print(f"time lost per save, async / sync: {lost['async'] / lost['sync']:.2f}")


if __name__ == "__main__":
    main()
