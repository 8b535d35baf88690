"""End to end from the trainer: a few steps of the default config, then `generate` straight from
the run directory (exported on the fly through megatron_mtp.convert)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_generate_from_run_dir(tmp_path):
    env = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_MTP_CACHE=str(tmp_path / "cache"))
    run_dir = tmp_path / "run"
    train = subprocess.run(
        [sys.executable, "-m", "megatron_mtp", "train", "configs/tiny_cpu.yaml", "--run-dir", str(run_dir),
         "--max-steps", "4",
         # the converter refuses the default group routing (megatron scores groups by top-1, HF by top-2)
         "model.router_group_topk=1"],
        capture_output=True, text=True, env=env, timeout=900,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    outputs = []
    for k in ("0", "2"):
        proc = subprocess.run(
            [sys.executable, "-m", "megatron_mtp", "generate", str(run_dir), "--prompt", "def main():",
             "--max-new-tokens", "12", "--speculative", k, "--ignore-eos", "--json"],
            capture_output=True, text=True, env=env, timeout=600,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    assert outputs[0]["tokens"] == outputs[1]["tokens"]
    assert len(outputs[1]["stats"]["acceptance_per_position"]) == 2
