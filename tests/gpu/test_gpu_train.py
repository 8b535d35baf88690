"""On a CUDA GPU: the tiny model trains in bf16 (and in FP8 where Transformer Engine is installed).

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


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"),
           "--run-dir", str(run_dir), "--max-steps", "4", "training.device=cuda", "training.precision=bf16",
           "logging.log_interval=1", "logging.eval_interval=0", *WIDER, *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=900, cwd=ROOT, env=dict(os.environ))


def _losses(run_dir: Path) -> list[float]:
    rows = [json.loads(line) for line in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    return [r["train/lm_loss"] for r in rows if "train/lm_loss" in r]


def test_bf16_trains_on_gpu(tmp_path):
    proc = _train(tmp_path / "bf16")
    assert proc.returncode == 0, proc.stderr[-4000:]
    losses = _losses(tmp_path / "bf16")
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)


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
