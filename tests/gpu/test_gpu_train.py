"""On a CUDA GPU: the tiny model learns in bf16 (and in FP8 where Transformer Engine is installed), and
an fp32 step on the GPU computes the loss the CPU computes from the same weights and data.

Skipped without a GPU (tests/conftest.py). tools/gpu_check.sh prints the longer version with
step times for each FP8 recipe.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu
ROOT = Path(__file__).resolve().parents[2]
WIDER = ["model.hidden_size=256", "model.ffn_hidden_size=512", "model.moe_ffn_hidden_size=128",
         "model.q_lora_rank=128", "model.kv_lora_rank=128", "model.qk_head_dim=64",
         "model.qk_pos_emb_head_dim=64", "model.v_head_dim=64"]


def _train(run_dir: Path, *overrides: str, steps: int = 4, device: str = "cuda") -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"),
           "--run-dir", str(run_dir), "--max-steps", str(steps), f"training.device={device}",
           "training.precision=bf16", "logging.log_interval=1", "logging.eval_interval=0", *WIDER, *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=dict(os.environ))


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/lm_loss"] for r in rows if "train/lm_loss" in r]


def test_bf16_trains_on_gpu(tmp_path):
    proc = _train(tmp_path / "bf16")
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = _losses(tmp_path / "bf16")
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0], losses  # it learns: 4 steps at the config's learning rate


def test_fp32_first_step_loss_equals_the_cpu_run(tmp_path):
    """Same weights (one CPU checkpoint, loaded weights-only by both), same seed and data: the GPU's
    fp32 loss of the first step is the CPU's within 1e-4 (only reduction order differs)."""
    seed = tmp_path / "seed"
    proc = _train(seed, "training.precision=fp32", steps=1, device="cpu")
    assert proc.returncode == 0, proc.stderr[-4000:]
    first = {}
    for device in ("cpu", "cuda"):
        run = tmp_path / device
        proc = _train(run, "training.precision=fp32", f"checkpoint.load={seed}", "checkpoint.load_optimizer=false",
                      steps=1, device=device)
        assert proc.returncode == 0, proc.stderr[-4000:]
        first[device] = _losses(run)[0]
    assert abs(first["cuda"] - first["cpu"]) < 1e-4, first


@pytest.mark.parametrize("recipe", ["delayed", "tensorwise", "blockwise"])
def test_fp8_trains_or_explains(tmp_path, recipe):
    from megatron_mtp.platform.detect import te_available

    proc = _train(tmp_path / recipe, f"training.fp8={recipe}")
    if not te_available():
        assert proc.returncode == 2
        assert "needs Transformer Engine" in proc.stderr and "Traceback" not in proc.stderr
        return
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert all(math.isfinite(x) for x in _losses(tmp_path / recipe))
