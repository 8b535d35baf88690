"""The README's main job, in a fresh process as a user starts it: no warning reaches the console."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.mcore]


def test_main_job_prints_no_warnings(tmp_path):
    import os

    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    env["OMP_NUM_THREADS"] = "1"
    proc = subprocess.run(
        [sys.executable, "-m", "megatron_mtp", "train", str(root / "configs" / "tiny_cpu.yaml"), "--run-dir",
         str(tmp_path / "run"), "--max-steps", "1", "training.seq_length=32", "training.micro_batch_size=2",
         "training.global_batch_size=4",
         "model.num_layers=2", "data.default_corpus_vocab_size=1024", "logging.tensorboard=false"],
        capture_output=True, text=True, env=env, timeout=600, cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Warning" not in proc.stderr + proc.stdout, proc.stderr[-3000:]
