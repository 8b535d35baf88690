"""The watchdog against long saves and broken heartbeats, and the process groups' own timeout, on the
suite's warm ranks: a save that keeps writing is never cut off by training.hang_timeout."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from megatron_mtp.errors import is_one_sentence
from tests.workers.pool import POOL

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("async_save", ["false", "true"], ids=["synchronous_write", "background_write"])
def test_a_save_several_times_longer_than_the_hang_timeout_is_published(tmp_path, train, async_save):
    """The writer takes about 5 s (platform/write_progress.py), hang_timeout is 1.5 s: the save of step 2 is
    waited for at the end of training (in save() itself when synchronous) and its growing bytes are progress."""
    run = tmp_path / "run"
    os.environ["MEGATRON_MTP_INJECT_SLOW_WRITE"] = "5"
    try:
        proc = train(run, steps=2, overrides=("training.hang_timeout=1.5", f"checkpoint.async_save={async_save}"))
    finally:
        del os.environ["MEGATRON_MTP_INJECT_SLOW_WRITE"]
    seconds = float(re.search(r"saved checkpoint \S+step_0000002 \(([0-9.]+) s\)", proc.stdout).group(1))
    assert seconds >= 3 * 1.5, proc.stdout[-2000:]
    assert (run / "checkpoints" / "latest").read_text().strip() == "step_0000002"
    assert json.loads((run / "checkpoints" / "step_0000002" / "train_state.json").read_text())["step"] == 2


def test_an_unwritable_heartbeat_directory_is_one_sentence_at_the_start(tmp_path, train):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "logs" / "heartbeat").write_text("not a directory")
    proc = train(run, steps=2, check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    lines = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert is_one_sentence(lines[0].split(" error: ", 1)[1]), lines[0]
    assert f"rank 0 cannot write its heartbeat file in {run / 'logs' / 'heartbeat'} (" in lines[0], lines[0]
    assert "writable by every rank" in lines[0], lines[0]
    assert not (run / "logs" / "metrics.jsonl").read_text().strip()  # no step ran


def test_every_group_megatron_core_builds_gets_the_collective_timeout(tmp_path):
    """With the watchdog off, training.collective_timeout is what ends a stuck collective: the gradient
    reduce runs on megatron-core's groups, which took their own 30-minute default before."""
    code = f"""
import datetime, torch
from megatron.core import parallel_state as ps
from megatron_mtp.config import load_config
from megatron_mtp.platform import setup
from megatron_mtp.training.distributed import destroy, init_distributed

cfg = load_config({str(ROOT / "configs" / "tiny_cpu.yaml")!r},
                  ["training.collective_timeout=17", "training.hang_timeout=0"])
init_distributed(cfg, setup("cpu"))
try:
    groups = {{"data": ps.get_data_parallel_group(), "tensor": ps.get_tensor_model_parallel_group(),
              "pipeline": ps.get_pipeline_model_parallel_group(), "expert": ps.get_expert_model_parallel_group(),
              "data_gloo": ps.get_data_parallel_group_gloo()}}
    for name, group in groups.items():
        print(name, group._get_backend(torch.device("cpu")).options._timeout.total_seconds())
finally:
    destroy()
"""
    proc = POOL.run(["-c", code], timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timeouts = dict(line.split() for line in proc.stdout.splitlines() if line.split()[:1] and
                    line.split()[0] in ("data", "tensor", "pipeline", "expert", "data_gloo"))
    assert len(timeouts) == 5 and all(float(t) == 17.0 for t in timeouts.values()), proc.stdout
