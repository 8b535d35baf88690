"""Start a local multi-process job with torchrun (torch.distributed.run) on this machine."""

from __future__ import annotations

import os
import socket
import subprocess
import sys


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_command(nproc: int, argv: list[str]) -> list[str]:
    """`python -m torch.distributed.run ... -m megatron_mtp ARGV` for `nproc` local processes."""
    return [
        sys.executable, "-m", "torch.distributed.run",
        "--nproc-per-node", str(nproc), "--nnodes", "1",
        "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
        "-m", "megatron_mtp", *argv,
    ]


def run_local(nproc: int, argv: list[str]) -> int:
    """Run `megatron-mtp ARGV` in `nproc` processes; returns the job's exit code."""
    env = dict(os.environ)
    # Each process would otherwise claim every core; on CPU, split them.
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    proc = subprocess.run(torchrun_command(nproc, argv), env=env)
    return proc.returncode
