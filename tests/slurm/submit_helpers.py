"""Helpers shared by the Slurm tests: run `megatron-mtp submit` as a real subprocess."""

from __future__ import annotations

import os
import re
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STUB = os.path.join(os.path.dirname(os.path.abspath(__file__)), "stub_trainer.py")


def submit_cli(args: list[str], env: dict[str, str], cwd: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """`megatron-mtp submit ARGS` in a subprocess (the console script's module form)."""
    env = dict({"STUB_CHECK_PYTHON": sys.executable, **env}, OMP_NUM_THREADS="1",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "megatron_mtp", "submit", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def submitted_job_id(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 0, f"submit failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}"
    match = re.search(r"submitted job (\d+)", proc.stdout)
    assert match, proc.stdout
    return match.group(1)


def read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as fh:
        return fh.read()
