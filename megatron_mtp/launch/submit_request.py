"""The fields of a `megatron-mtp submit`, listed once.

Each field of ``SubmitRequest`` carries its command-line option (flag, help, group) in its metadata:
``add_arguments`` builds the parser from them and ``from_args`` reads the parsed namespace back, so a
new option is one field here. ``JobPlan`` (job_plan.py) keeps the request and adds only what it
resolves (tasks per node, parsed mounts and environment, the interpreter, the run directory as the
job sees it). No torch import here.
"""

from __future__ import annotations

import argparse
from dataclasses import MISSING, dataclass, field, fields
from typing import Literal, Optional

ResumeMode = Literal["requeue", "chain", "none"]
GROUPS = ("resources", "slurm", "container (pyxis/enroot)", "environment and resume")


def _option(default, help: str, group: Optional[str] = None, flag: Optional[str] = None, **argparse_kwargs):
    """A field that is also a command-line option (`--name-with-dashes` unless `flag` says otherwise)."""
    meta = {"help": help, "group": group, "flag": flag, "argparse": argparse_kwargs}
    if isinstance(default, list):
        return field(default_factory=list, metadata={**meta, "repeat": True})
    return field(default=default, metadata=meta)


@dataclass
class SubmitRequest:
    """The user's submission, as given on the command line."""

    config: str = field(metadata={"help": "run config YAML (configs/tiny_cpu.yaml, ...)", "positional": True})
    overrides: list[str] = field(default_factory=list, metadata={
        "help": "dotted config overrides, applied after the YAML (write them right after CONFIG)",
        "positional": True, "argparse": {"nargs": "*", "metavar": "key.path=value"}})
    nodes: int = _option(1, "nodes to allocate (default 1)", "resources", type=int)
    gpus_per_node: Optional[int] = _option(
        None, "GPUs per node; one training process (task) runs per GPU", "resources", type=int)
    cpu: bool = _option(False, "CPU-only job: no GPUs requested, gloo backend, training.device=cpu", "resources",
                        action="store_true")
    tasks_per_node: Optional[int] = _option(
        None, "with --cpu: training processes per node (default 1)", "resources", type=int)
    cpus_per_task: Optional[int] = _option(
        None, "CPU cores per training process (sets OMP_NUM_THREADS too)", "resources", type=int)
    partition: Optional[str] = _option(None, "Slurm partition", "slurm")
    account: Optional[str] = _option(None, "Slurm account to charge", "slurm")
    qos: Optional[str] = _option(None, "Slurm quality of service", "slurm")
    time: Optional[str] = _option(None, "time limit per job: minutes, HH:MM:SS or D-HH:MM:SS", "slurm")
    job_name: Optional[str] = _option(None, "job name (default mtp-<config name>)", "slurm")
    dependency: Optional[str] = _option(None, "Slurm dependency of the (first) job, e.g. afterok:123456", "slurm")
    sbatch_args: list[str] = _option(
        [], "extra sbatch option written into the script (repeatable), e.g. --sbatch-arg=--exclusive", "slurm",
        flag="--sbatch-arg", metavar="--OPTION[=VALUE]")
    container_image: Optional[str] = _option(
        None, "container image for every rank (pyxis --container-image)", GROUPS[2])
    container_mounts: list[str] = _option(
        [], "host paths to mount into the container (repeatable); run dir and data must be under one", GROUPS[2],
        metavar="SRC[:DST[:ro]],...")
    python: Optional[str] = _option(
        None, "interpreter that runs megatron_mtp in the job (default: this one; 'python' in a container)",
        GROUPS[2])
    env: list[str] = _option([], "environment variable for every rank (repeatable), e.g. NCCL_IB_HCA=mlx5",
                             GROUPS[3], metavar="NAME=value")
    resume: ResumeMode = _option(
        "requeue", "after a save-and-exit: requeue the same job (default), let the next job of a --chain run, "
        "or stop", GROUPS[3], choices=["requeue", "chain", "none"])
    chain: int = _option(1, "with --resume chain: number of dependent jobs to queue", GROUPS[3], type=int)
    signal_before: int = _option(
        300, "ask Slurm for the save signal this many seconds before the time limit (default 300)", GROUPS[3],
        type=int, metavar="SECONDS")
    max_restarts: int = _option(50, "stop requeueing after this many restarts (default 50)", GROUPS[3], type=int)
    run_dir: Optional[str] = _option(
        None, "run directory on a filesystem all nodes share (default ./runs/<config name>)")
    gpu: Optional[str] = _option(
        None, "GPU the memory plan checks the layout against: h100 (default), h100-pcie, h100-nvl, h200, b200, "
        "gb200 or GiB per GPU; "
        "--cpu jobs are not checked")
    force: bool = _option(False, "submit even if the memory plan predicts a rank over the GPU's memory",
                          action="store_true")
    workdir: Optional[str] = None
    """Submit-host working directory (default: the current one); not a command-line option."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "SubmitRequest":
        return cls(**{f.name: getattr(args, f.name) for f in fields(cls) if "help" in f.metadata})


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """One argument per ``SubmitRequest`` field that has a help text, in field order and groups."""
    groups = {name: parser.add_argument_group(name) for name in GROUPS}
    for f in fields(SubmitRequest):
        meta = f.metadata
        if "help" not in meta:
            continue
        kwargs = {"help": meta["help"], **meta.get("argparse", {})}
        if meta.get("positional"):
            parser.add_argument(f.name, **kwargs)
            continue
        if meta.get("repeat"):
            kwargs.update(action="append", default=[])
        elif f.default is not MISSING:
            kwargs["default"] = f.default
        flag = meta["flag"] or "--" + f.name.replace("_", "-")
        target = groups[meta["group"]] if meta["group"] else parser
        target.add_argument(flag, dest=f.name, **kwargs)
