"""Benchmark: to-hf conversion throughput vs `cp` and peak memory, small model vs a ~4x larger one.

Both checkpoints are real torch_dist checkpoints written by the converter's own save path
(``TorchDistWriter``, the same files megatron-core loads), with random weights of a DeepSeek-V3-like
config; the large one has ~4x the layers (so ~4x the bytes) and the same largest tensor.

For each: ``cp -r`` of the checkpoint (page cache warm for both), then ``export_to_hf --dtype fp32
--mtp inline`` (the same number of bytes out as in) in a fresh subprocess that reports its peak
RSS (times include the final sync, as does cp's). The checkpoints carry the trainer's
``weights_finite: true`` record, so the copied bytes are not scanned a second time; the same fp32
export of a checkpoint without the record (an import, an older checkpoint: scanned) is timed beside
it. The bf16 export (decode + cast, half the bytes out) and the fp8 export (decode + block
quantisation, DeepSeek's release format) are timed too, with their output sizes. Prints throughput
ratio (cp time / convert time, target >= 0.5), RSS large/small (target <= 1.2) and absolute
(target <= 2 GB + largest tensor), and fp8/bf16 time and size.

    python tools/bench/bench_convert.py [--workdir DIR] [--small-layers 2] [--hidden 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter  # noqa: E402
from megatron_mtp.config import Config  # noqa: E402
from megatron_mtp.config.model import MTPConfig  # noqa: E402
from megatron_mtp.convert.shapes import expected_shape  # noqa: E402
from megatron_mtp.models.deepseek_v3.hf_mapping import param_table  # noqa: E402
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig as ModelConfig  # noqa: E402


def model_config(layers: int, hidden: int) -> Config:
    model = ModelConfig(
        num_layers=layers, hidden_size=hidden, ffn_hidden_size=hidden * 11 // 4, num_attention_heads=8,
        vocab_size=8192, q_lora_rank=hidden // 4, kv_lora_rank=hidden // 8, qk_head_dim=64,
        qk_pos_emb_head_dim=32, v_head_dim=64, num_experts=16, first_k_dense=1, moe_ffn_hidden_size=hidden // 2,
        num_shared_experts=1, router_topk=4, router_num_groups=None, router_group_topk=None,
    )
    return Config(name=f"bench_{layers}", model=model, mtp=MTPConfig(num_layers=1))


def _shapes(cfg: Config) -> dict[str, tuple[int, ...]]:
    """Global megatron-core shapes of every model tensor for this config."""
    m = cfg.model
    return {p.mcore: expected_shape(p.mcore, m, m.vocab_size)
            for p in param_table(m, cfg.mtp.num_layers, spec="local", mtp_copies=False)}


def write_checkpoint(cfg: Config, out: Path) -> int:
    """A random-weight torch_dist checkpoint (+ config.yaml); returns its model bytes."""
    g = torch.Generator().manual_seed(0)
    writer = TorchDistWriter(out)
    total = 0
    for key, shape in _shapes(cfg).items():
        if ".experts.experts." in key:
            writer.declare(key, shape, torch.float32)
            for e in range(shape[0]):
                writer.write_chunk(key, (e, 0, 0), torch.randn((1, *shape[1:]), generator=g) * 0.02)
        else:
            writer.write_tensor(key, torch.randn(shape, generator=g) * 0.02)
        total += torch.Size(shape).numel() * 4
    writer.finish({})
    (out / "config.yaml").write_text(cfg.to_yaml())
    (out / "train_state.json").write_text(json.dumps({"step": 0, "has_optimizer": False, "weights_finite": True}))
    return total


_CHILD = """
import json, os, resource, sys, time
import torch.distributed.checkpoint  # imports are a fixed cost, not conversion throughput
from megatron_mtp.config import load_config
from megatron_mtp.convert.to_hf import export_to_hf
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t = time.perf_counter()
export_to_hf(sys.argv[1], sys.argv[2], mtp="inline", dtype=sys.argv[3])
os.sync()
seconds = time.perf_counter() - t
size = sum(f.stat().st_size for f in __import__("pathlib").Path(sys.argv[2]).glob("*.safetensors"))
print(json.dumps({"seconds": seconds, "peak_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                  "base_kb": base, "bytes": size}))
"""


def measure(ckpt: Path, work: Path) -> dict:
    t = time.perf_counter()
    subprocess.run(["cp", "-r", str(ckpt), str(work / "cp")], check=True)
    subprocess.run(["sync"], check=True)
    cp_seconds = time.perf_counter() - t
    shutil.rmtree(work / "cp")
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_MTP_NO_PROGRESS="1", PYTHONPATH=str(REPO))
    state = ckpt / "train_state.json"
    recorded = state.read_text()
    results = {}
    for label, dtype in (("fp32", "fp32"), ("scanned", "fp32"), ("bf16", "bf16"), ("fp8", "fp8")):
        state.write_text(recorded if label != "scanned" else json.dumps({"step": 0, "has_optimizer": False}))
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(ckpt), str(work / "hf"), dtype], env=env,
                              check=True, capture_output=True, text=True)
        results[label] = json.loads(proc.stdout.strip().splitlines()[-1])
        subprocess.run(["sync"], check=True)
        shutil.rmtree(work / "hf")
    state.write_text(recorded)
    result = dict(results["fp32"], cp_seconds=cp_seconds, scanned_seconds=results["scanned"]["seconds"],
                  bf16_seconds=results["bf16"]["seconds"], fp8_seconds=results["fp8"]["seconds"],
                  bf16_bytes=results["bf16"]["bytes"], fp8_bytes=results["fp8"]["bytes"])
    result["peak_kb"] = max(r["peak_kb"] for r in results.values())
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a new temp dir)")
    parser.add_argument("--small-layers", type=int, default=2, help="main layers of the small model")
    parser.add_argument("--hidden", type=int, default=1024, help="hidden size of both models")
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench_convert_"))
    work.mkdir(parents=True, exist_ok=True)
    small = model_config(args.small_layers, args.hidden)
    def total(cfg: Config) -> int:
        return sum(torch.Size(shape).numel() for shape in _shapes(cfg).values())

    target = 4 * total(small)
    large_layers = min(range(args.small_layers, 8 * args.small_layers + 8),
                       key=lambda n: abs(total(model_config(n, args.hidden)) - target))
    large = model_config(large_layers, args.hidden)
    rows = []
    try:
        for cfg in (small, large):
            ckpt = work / cfg.name
            nbytes = write_checkpoint(cfg, ckpt)
            largest = max(torch.Size(s).numel() * 4 for s in _shapes(cfg).values())
            r = measure(ckpt, work)
            shutil.rmtree(ckpt)
            rows.append((cfg, nbytes, largest, r))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{'model':<10}{'layers':>7}{'GB':>7}{'cp s':>8}{'to-hf s':>9}{'cp/to-hf':>10}{'scanned s':>11}"
          f"{'bf16 s':>8}{'fp8 s':>7}{'peak RSS MB':>13}{'largest MB':>12}")
    for cfg, nbytes, largest, r in rows:
        print(f"{cfg.name:<10}{cfg.model.num_layers:>7}{nbytes / 1e9:>7.2f}{r['cp_seconds']:>8.2f}{r['seconds']:>9.2f}"
              f"{r['cp_seconds'] / r['seconds']:>10.2f}{r['scanned_seconds']:>11.2f}{r['bf16_seconds']:>8.2f}"
              f"{r['fp8_seconds']:>7.2f}{r['peak_kb'] / 1024:>13.0f}{largest / 2**20:>12.0f}")
    (_, b_small, _, r_small), (_, b_large, largest, r_large) = rows
    print(f"size ratio large/small: {b_large / b_small:.2f}")
    print(f"throughput vs cp (large): {r_large['cp_seconds'] / r_large['seconds']:.2f} (target >= 0.5); "
          f"without the weights_finite record (scanned): {r_large['cp_seconds'] / r_large['scanned_seconds']:.2f}")
    print(f"fp8 / bf16 export (large): time {r_large['fp8_seconds'] / r_large['bf16_seconds']:.2f}, "
          f"size {r_large['fp8_bytes'] / r_large['bf16_bytes']:.3f}")
    print(f"peak RSS large/small: {r_large['peak_kb'] / r_small['peak_kb']:.2f} (target <= 1.2)")
    limit_mb = 2048 + largest / 2**20
    print(f"peak RSS large: {r_large['peak_kb'] / 1024:.0f} MB (target <= 2 GB + largest tensor = {limit_mb:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
