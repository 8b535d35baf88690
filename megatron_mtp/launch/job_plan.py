"""What `megatron-mtp submit` will ask Slurm for, checked before anything reaches the queue.

``SubmitRequest`` (submit_request.py) is the user's input, typed, from the command line; ``build_plan`` validates it
against the run config (its flags alone in request_checks.py, the paths a container sees in
container_mounts.py) and returns a ``JobPlan`` holding everything the job script needs. Every
problem raises ``UserError`` with one sentence, so no queue slot is wasted on a job that would fail
at start-up. Nothing is written here: see submit.py for the run directory.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.config import Config, load_config
from megatron_mtp.config.parallel_sizes import grid_refusal
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.launch.container_mounts import Mount, into_container, parse_mounts
from megatron_mtp.launch.request_checks import check_request
from megatron_mtp.launch.submit_request import SubmitRequest

__all__ = ["JobPlan", "SubmitRequest", "build_plan", "check_memory"]


@dataclass
class JobPlan:
    """A validated submission: everything the sbatch script is rendered from. The request's own
    fields (partition, time, resume, ...) are read from ``request``; the plan holds what it resolves."""

    request: SubmitRequest
    config: Config
    """The resolved config the job trains with (paths as the job sees them)."""
    run_dir: str
    """Absolute run directory on the submit host."""
    job_run_dir: str
    """The run directory as the job sees it (differs from run_dir only inside a container)."""
    tasks_per_node: int
    gpus_per_node: Optional[int]
    time_seconds: Optional[int]
    job_name: str
    container_mounts: list[Mount]
    env: dict[str, str]
    python: str
    workdir: str
    """Submit-host working directory (the job starts there, so relative paths keep meaning)."""
    job_workdir: str
    resume_from: Optional[str] = None
    """The checkpoint the job will resume from (RUN_DIR/checkpoints/<latest>), None for a fresh run."""
    memory: Optional[str] = None
    """The memory plan's one-line verdict (GPU jobs)."""

    @property
    def world_size(self) -> int:
        return self.request.nodes * self.tasks_per_node

    @property
    def cpu(self) -> bool:
        return self.gpus_per_node is None

    @property
    def snapshot_path(self) -> str:
        return os.path.join(self.run_dir, "slurm", "config.yaml")

    @property
    def job_snapshot_path(self) -> str:
        return os.path.join(self.job_run_dir, "slurm", "config.yaml")


def build_plan(request: SubmitRequest) -> JobPlan:
    """Validate ``request`` and the config it names; raise UserError on the first problem."""
    checked = check_request(request)
    tasks_per_node, gpus_per_node = checked.tasks_per_node, checked.gpus_per_node

    device_overrides = ["training.device=cpu", "parallel.backend=gloo"] if request.cpu else []
    cfg = load_config(request.config, list(request.overrides))
    _check_device(cfg, request.cpu)
    if request.cpu:  # applied last: _check_device refused every value they could contradict
        cfg = load_config(request.config, list(request.overrides) + device_overrides)
    _check_layout(cfg, request.nodes, tasks_per_node)
    validate(cfg, request.nodes * tasks_per_node)  # the trainer's own start-up checks, run here first
    memory = None if request.cpu else check_memory(cfg, request.nodes * tasks_per_node, request.gpu, request.force)
    _check_data_paths(cfg)

    workdir = os.path.abspath(request.workdir or os.getcwd())
    run_dir = os.path.abspath(request.run_dir or os.path.join(workdir, "runs", cfg.name))
    _check_run_dir(run_dir)
    resume_from = _check_resume_point(run_dir, cfg)

    mounts = parse_mounts(request.container_mounts)
    if mounts and not request.container_image:
        raise UserError(
            "--container-mounts was given without --container-image; name the container image to run in "
            "(e.g. --container-image nvcr.io/nvidia/pytorch:25.09-py3)"
        )
    job_cfg, job_run_dir, job_workdir = cfg, run_dir, workdir
    if request.container_image:
        job_cfg, job_run_dir, job_workdir = into_container(cfg, run_dir, workdir, mounts)
        python = request.python or "python"
    else:
        python = _check_python(request.python or sys.executable)

    return JobPlan(
        request=request,
        config=job_cfg,
        run_dir=run_dir,
        job_run_dir=job_run_dir,
        tasks_per_node=tasks_per_node,
        gpus_per_node=gpus_per_node,
        time_seconds=checked.time_seconds,
        job_name=request.job_name or f"mtp-{cfg.name}",
        container_mounts=mounts,
        env=checked.env,
        python=python,
        workdir=workdir,
        job_workdir=job_workdir,
        resume_from=resume_from,
        memory=memory,
    )


def check_memory(cfg: Config, world: int, gpu: Optional[str], force: bool) -> str:
    """Refuse a GPU layout the memory plan predicts over the GPU's memory (unless forced); the verdict."""
    from megatron_mtp.plan.memory import make_plan, suggestions
    from megatron_mtp.platform.gpus import GIB, parse_gpu

    gpu_spec = parse_gpu(gpu)
    try:
        plan = make_plan(cfg, world, gpu_spec)
    except UserError as exc:
        if cfg.model.vocab_size is None:  # the tokenizer the datasets recorded is only read by the trainer
            return f"memory plan: not checked ({exc})"
        raise
    worst, cap = plan.worst, plan.gpu.memory_bytes
    verdict = (f"pipeline rank {worst.pp_rank} needs {worst.total / GIB:.1f} GiB of the {plan.gpu.name}'s "
               f"{cap / GIB:.1f} GiB")
    if plan.fits or force:
        return f"memory plan: {verdict}" + ("" if plan.fits else " (over memory, submitted with --force)")
    tries = "; ".join(f"{o} ({b / GIB:.1f} GiB)" for o, b in suggestions(plan, world)[:3])
    raise UserError(f"the memory plan predicts {verdict}, so the job would run out of memory; "
                    + (f"try, in this order: {tries}; " if tries else "")
                    + "see `megatron-mtp plan` with the same arguments, or pass --force to submit anyway")


# --------------------------------------------------------------------------- config


def _check_device(cfg: Config, cpu: bool) -> None:
    if cpu:
        if cfg.training.device == "cuda":
            raise UserError(
                "the config sets training.device=cuda but the job was submitted with --cpu; "
                "drop --cpu and give --gpus-per-node, or override training.device=cpu"
            )
        if cfg.parallel.backend == "nccl":
            raise UserError(
                "the config sets parallel.backend=nccl but --cpu jobs have no GPUs; "
                "override parallel.backend=gloo (or auto)"
            )
    elif cfg.training.device == "cpu":
        raise UserError(
            "the config sets training.device=cpu but GPUs were requested with --gpus-per-node; "
            "submit with --cpu --tasks-per-node N instead"
        )


def _check_layout(cfg: Config, nodes: int, tasks_per_node: int) -> None:
    """The job's process count against the config's grid: the rule validation and `plan` apply
    (config/parallel_sizes.grid_refusal), with advice in submit's own flags; validate() checks the rest."""
    world = nodes * tasks_per_node
    where = f"{nodes} node(s) × {tasks_per_node} task(s) = {world} processes"
    p = cfg.parallel
    if p.world_size is not None and p.world_size != world:
        raise UserError(
            f"the config expects parallel.world_size={p.world_size} but the job has {where}; "
            "change --nodes/--gpus-per-node or the config"
        )
    refusal = grid_refusal(cfg, world)
    if refusal:
        raise UserError(f"{where} {refusal[0]}; change --nodes/--gpus-per-node (--tasks-per-node with --cpu) "
                        f"or {refusal[1]}")


def _check_data_paths(cfg: Config) -> None:
    from megatron_mtp.data.prefixes import expand_blend
    from megatron_mtp.models.default_corpus_rule import default_corpus_refusal

    d = cfg.data
    refusal = default_corpus_refusal(cfg)
    if refusal:
        raise UserError(refusal)
    for key, entries, weights in (("data.paths", d.paths, d.weights), ("data.valid_paths", d.valid_paths,
                                                                        d.valid_weights)):
        prefixes = expand_blend(list(entries), weights, key)[0] if entries else []
        for prefix in prefixes:
            if os.path.exists(prefix):
                continue
            missing = [ext for ext in (".bin", ".idx") if not os.path.exists(prefix + ext)]
            if missing:
                raise UserError(
                    f"{key} entry '{prefix}' has no {' or '.join(prefix + m for m in missing)} on this machine; "
                    "run `megatron-mtp preprocess` or fix the path (the job's nodes must see it too)"
                )
    if d.tokenizer is not None and not os.path.exists(d.tokenizer):
        raise UserError(
            f"data.tokenizer '{d.tokenizer}' does not exist; point it at a tokenizer.json or a directory holding one"
        )
    if d.cache_dir is not None and not _creatable(d.cache_dir):
        raise UserError(
            f"data.cache_dir '{d.cache_dir}' cannot be created or written; choose a writable shared directory"
        )
    if cfg.checkpoint.load is not None and not os.path.exists(cfg.checkpoint.load):
        raise UserError(
            f"checkpoint.load '{cfg.checkpoint.load}' does not exist; give an existing checkpoint or run directory"
        )


def _creatable(path: str) -> bool:
    """The directory exists and is writable, or its nearest existing parent is."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            return False
        probe = parent
    return os.path.isdir(probe) and os.access(probe, os.W_OK | os.X_OK)


def _check_run_dir(run_dir: str) -> None:
    if os.path.exists(run_dir) and not os.path.isdir(run_dir):
        raise UserError(f"run directory '{run_dir}' is a file; give --run-dir a directory path")
    if not _creatable(run_dir):
        raise UserError(
            f"run directory '{run_dir}' cannot be created or written by you; "
            "give --run-dir a writable (shared) directory"
        )


def _check_resume_point(run_dir: str, cfg: Config) -> Optional[str]:
    """The checkpoint a job in ``run_dir`` resumes from; refuse a layout that could not load it."""
    from megatron_mtp.checkpoint.info import check_optimizer_compatible, optimizer_layout, read_train_state
    from megatron_mtp.checkpoint.run_dir import find_checkpoint

    found = find_checkpoint(run_dir)
    if found is None:
        return None
    # The trainer resumes its own run directory with optimizer state; apply its rule now.
    reason = check_optimizer_compatible(read_train_state(found.path), cfg.parallel.expert, optimizer_layout(cfg))
    if reason is not None:
        raise UserError(f"the job would resume from {found.path}, but {reason}; keep the saved parallel layout "
                        "or use a new --run-dir")
    return str(found.path)


def _check_python(python: str) -> str:
    found = shutil.which(python)
    if found is None:
        raise UserError(
            f"--python '{python}' is not an executable on this machine; "
            "give the interpreter that has megatron_mtp installed"
        )
    return os.path.abspath(found) if os.sep in python else python
