"""Helpers that run real training jobs for the multi-process tests, on the session's warm worker jobs
(tests/workers: one set of real gloo ranks per world size, each command run as `megatron-mtp` runs it)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.workers.pool import POOL

ROOT = Path(__file__).resolve().parents[2]
SMALL = [
    # a smaller, faster variant of configs/tiny_cpu.yaml for tests
    "training.seq_length=64", "training.micro_batch_size=2", "training.global_batch_size=8",
    "logging.log_interval=1", "logging.eval_interval=0", "logging.tensorboard=false",
    "schedule.warmup_steps=0", "schedule.decay_style=constant", "checkpoint.save_interval=0",
    "data.default_corpus_vocab_size=1024", "model.num_layers=2",
]


def train(run_dir: Path, nproc: int = 1, steps: int = 3, overrides: tuple = (), check: bool = True,
          timeout: int = 600, config: str = "tiny_cpu") -> subprocess.CompletedProcess:
    """`megatron-mtp train configs/CONFIG.yaml` (tiny_cpu unless told) on `nproc` ranks."""
    cmd = ["-m", "megatron_mtp", "train", str(ROOT / "configs" / f"{config}.yaml"),
           "--run-dir", str(run_dir), "--max-steps", str(steps), *SMALL, *overrides]
    proc = POOL.run(cmd, nproc=nproc, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"training failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}")
    return proc


def script(name: str, *args, nproc: int = 1, timeout: int = 900) -> subprocess.CompletedProcess:
    """tests/dist/scripts/NAME with ARGS on `nproc` ranks."""
    return POOL.run([str(Path(__file__).parent / "scripts" / name), *map(str, args)], nproc=nproc, timeout=timeout)


def metrics(run_dir: Path) -> list[dict]:
    path = run_dir / "logs" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def run_as_of(src: Path, dst: Path, step: int) -> Path:
    """A copy ``dst`` of the run directory ``src`` as it stood after its checkpoint of ``step``: later checkpoints
    and log rows left out, ``latest`` naming that step. A resume of it continues from the run's own state, so a
    test need not train those steps again."""
    import shutil

    names = {p.name for p in (src / "checkpoints").glob("step_*") if int(p.name.split("_")[1]) > step}
    shutil.copytree(src, dst, ignore=lambda _, entries: [e for e in entries if e in names])
    (dst / "checkpoints" / "latest").write_text(f"step_{step:07d}")
    rows = [row for row in metrics(src) if row.get("step", 0) <= step]
    (dst / "logs" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return dst


def probe_logits(ckpt: Path, tokens_file: Path, out: Path, nproc: int = 1, overrides: tuple = ()) -> dict:
    """Full logits of a checkpoint at a layout (scripts/forward_logits.py)."""
    import torch

    argv = [str(Path(__file__).parent / "scripts" / "forward_logits.py"), str(ckpt), str(tokens_file), str(out)]
    proc = POOL.run([*argv, *overrides], nproc=nproc, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return torch.load(out)


@pytest.fixture(name="train", scope="session")
def _train():
    return train


@pytest.fixture(name="script", scope="session")
def _script():
    return script


@pytest.fixture(name="metrics", scope="session")
def _metrics():
    return metrics


@pytest.fixture(name="probe_logits", scope="session")
def _probe_logits():
    return probe_logits


@pytest.fixture(name="small_overrides", scope="session")
def _small_overrides():
    return list(SMALL)
