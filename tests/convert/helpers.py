"""Shared helpers for the conversion tests: commands on the suite's warm ranks (tests/workers) with small,
quiet environments."""

from __future__ import annotations

import filecmp
import math
import os
import subprocess
import sys
from pathlib import Path

import torch

from tests.workers.pool import POOL

HERE = Path(__file__).parent
REPO = HERE.parent.parent


QUIET = {"OMP_NUM_THREADS": "1", "MEGATRON_MTP_NO_PROGRESS": "1", "PYTHONWARNINGS": "ignore"}


def env(**extra: str) -> dict:
    return {**os.environ, **QUIET, **extra}


def same_tree(a: Path, b: Path) -> None:
    """Same files with the same bytes; SERVING.md aside (it names the directory it lies in)."""
    names = sorted(p.name for p in a.iterdir() if p.name != "SERVING.md")
    assert names == sorted(p.name for p in b.iterdir() if p.name != "SERVING.md")
    for name in names:
        if (a / name).is_dir():
            same_tree(a / name, b / name)
        else:
            assert filecmp.cmp(a / name, b / name, shallow=False), name


def run(argv: list[str], nproc: int = 1, timeout: int = 600, check: bool = True, **extra: str
        ) -> subprocess.CompletedProcess:
    """`python ARGV` on `nproc` warm ranks (raises with the output if it fails, unless check=False)."""
    return POOL.run(argv, nproc=nproc, timeout=timeout, check=check, env={**QUIET, **extra}, cwd=REPO)


def sharded_io(mode: str, path: Path, nproc: int = 1) -> subprocess.CompletedProcess:
    return run([str(HERE / "sharded_io_script.py"), mode, str(path)], nproc=nproc)


def megatron_cli(*args: str, timeout: int = 900, nproc: int = 1, check: bool = True) -> subprocess.CompletedProcess:
    """`megatron-mtp ARGS` (one process unless nproc says otherwise)."""
    return run(["-m", "megatron_mtp.cli", *args], nproc=nproc, timeout=timeout, check=check)


def launched_cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`megatron-mtp ARGS` in a new process, as a user starts it (for `--nproc-per-node`, which launches
    its own ranks)."""
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp.cli", *args], cwd=REPO, env=env(), capture_output=True,
                          text=True, timeout=timeout)
    if proc.returncode != 0:
        raise AssertionError(f"megatron-mtp {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-5000:]}")
    return proc


def hf_tensors(*dirs: Path) -> dict:
    """Every tensor of the safetensors files in `dirs` (an HF export's main/ and mtp/, say), by name."""
    from safetensors import safe_open

    out = {}
    for d in dirs:
        for f in sorted(d.glob("*.safetensors")):
            with safe_open(str(f), "pt") as h:
                out.update({k: h.get_tensor(k) for k in h.keys()})
    return out


def reference_fp8_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek's rule, block by block: scale = amax / 448, value = round-to-nearest e4m3 of x / scale
    (an all-zero block: scale 1). The reference the FP8 export is checked against, and the maker of
    release-format inputs for the import tests."""
    rows, cols = w.shape
    scale = torch.empty(math.ceil(rows / 128), math.ceil(cols / 128))
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    for i in range(scale.shape[0]):
        for j in range(scale.shape[1]):
            block = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            amax = block.abs().max()
            scale[i, j] = amax / 448.0 if amax > 0 else 1.0
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (block / scale[i, j]).to(torch.float8_e4m3fn)
    return q, scale
