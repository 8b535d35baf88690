"""Checkpoint save in the two optimizer formats: save time and the host memory a save adds, at 1, 2 and 4 ranks.

For each rank count and each checkpoint.optimizer_format (parallel: megatron-core's dp_reshardable,
every rank writes its own shard; reshardable: fully_reshardable, the shards are all-gathered onto
every rank first), one real training run (`megatron-mtp train`, data parallel over the ranks with the
experts split EP=ranks) of --steps steps that saves once, at its end. While it runs, every rank's
resident memory is sampled every 5 ms (its pid comes from its heartbeat file, training/watchdog.py);
the save starts when the last step's row reaches logs/metrics.jsonl. Printed per run: the save time
the trainer reports, and the save's peak resident memory above the peak of everything before it
(model build and training steps; the worst rank), with the ratio reshardable / parallel measured side
by side.

    .venv/bin/python tools/bench/bench_checkpoint_formats.py [--hidden 768] [--steps 3] [--ranks 1 2 4]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GIB = 2**30


def _rss(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def run(work: Path, ranks: int, fmt: str, args) -> dict:
    run_dir = work / f"{fmt}_{ranks}"
    h = args.hidden
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--run-dir",
           str(run_dir), "--max-steps", str(args.steps), f"model.hidden_size={h}", f"model.ffn_hidden_size={3 * h}",
           f"model.moe_ffn_hidden_size={3 * h // 4}", "training.seq_length=128", "training.micro_batch_size=1",
           f"training.global_batch_size={ranks}", "logging.log_interval=1", "logging.tensorboard=false",
           "checkpoint.save_interval=0", "checkpoint.async_save=false", f"checkpoint.optimizer_format={fmt}",
           f"parallel.expert={ranks}"]
    if ranks > 1:
        cmd += ["--nproc-per-node", str(ranks)]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 2) // ranks)), PYTHONWARNINGS="ignore")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    beats = run_dir / "logs" / "heartbeat"
    metrics = run_dir / "logs" / "metrics.jsonl"
    pids: dict[int, int] = {}
    steps_peak: dict[int, int] = {}
    save_peak: dict[int, int] = {}
    saving = False  # the last step's metrics row is written just before its save starts
    while proc.poll() is None:
        for f in beats.glob("rank-*.json") if beats.is_dir() and len(pids) < ranks else []:
            try:
                beat = json.loads(f.read_text())
                pids[int(beat["rank"])] = int(beat["pid"])
            except (OSError, ValueError, KeyError):
                continue
        if not saving and metrics.is_file():
            saving = any(json.loads(line).get("step") == args.steps for line in metrics.read_text().splitlines()
                         if line.strip())
        for rank, pid in pids.items():
            peaks = save_peak if saving else steps_peak
            peaks[rank] = max(peaks.get(rank, 0), _rss(pid))
        time.sleep(0.005)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(err[-3000:])
    seconds = [float(x) for x in re.findall(r"saved checkpoint \S+ \(([\d.]+) s\)", out)]
    added = max(save_peak.get(r, 0) - steps_peak.get(r, 0) for r in steps_peak)
    size = sum(p.stat().st_size for p in (run_dir / "checkpoints").rglob("*") if p.is_file())
    shutil.rmtree(run_dir, ignore_errors=True)
    return {"save_s": seconds[-1] if seconds else float("nan"), "added_bytes": added, "checkpoint_bytes": size}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=768)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench_checkpoint_formats_"))
    try:
        print(f"{'ranks':>5} {'format':>12} {'save s':>8} {'save adds GiB (worst rank)':>27} {'checkpoint GiB':>15}")
        for ranks in args.ranks:
            results = {fmt: run(work, ranks, fmt, args) for fmt in ("parallel", "reshardable")}
            for fmt, r in results.items():
                print(f"{ranks:>5} {fmt:>12} {r['save_s']:8.2f} {r['added_bytes'] / GIB:27.3f} "
                      f"{r['checkpoint_bytes'] / GIB:15.3f}")
            p, f = results["parallel"], results["reshardable"]
            print(f"{ranks:>5} {'ratio':>12} {f['save_s'] / p['save_s']:8.2f} "
                  f"{f['added_bytes'] / max(p['added_bytes'], 1):27.2f}   (reshardable / parallel)", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
