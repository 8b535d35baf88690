"""Shared helpers for the conversion tests: subprocess launches with small, quiet environments."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

from megatron_mtp.launch.local import free_port

HERE = Path(__file__).parent
REPO = HERE.parent.parent


def env(**extra: str) -> dict:
    e = dict(os.environ, OMP_NUM_THREADS="1", MEGATRON_MTP_NO_PROGRESS="1", PYTHONWARNINGS="ignore")
    e.update(extra)
    return e


def same_tree(a: Path, b: Path) -> None:
    """Same files with the same bytes; SERVING.md aside (it names the directory it lies in)."""
    names = sorted(p.name for p in a.iterdir() if p.name != "SERVING.md")
    assert names == sorted(p.name for p in b.iterdir() if p.name != "SERVING.md")
    for name in names:
        if (a / name).is_dir():
            same_tree(a / name, b / name)
        else:
            assert filecmp.cmp(a / name, b / name, shallow=False), name


def run(cmd: list[str], timeout: int = 600, **extra: str) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=REPO, env=env(**extra), capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def sharded_io(mode: str, path: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    script = str(HERE / "sharded_io_script.py")
    port = str(free_port())
    if nproc == 1:
        return run([sys.executable, script, mode, str(path)], MASTER_PORT=port)
    return run([sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}",
                f"--master-port={port}", script, mode, str(path)])


def megatron_cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "megatron_mtp.cli", *args], timeout=timeout)
