"""What `megatron-mtp submit` will ask Slurm for, checked before anything reaches the queue.

``SubmitRequest`` (submit_request.py) is the user's input, typed, from the command line; ``build_plan`` validates it
against the run config and returns a ``JobPlan`` holding everything the job script needs. Every
problem raises ``UserError`` with one sentence, so no queue slot is wasted on a job that would fail
at start-up. Nothing is written here: see submit.py for the run directory.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import sys
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.config import Config, load_config
from megatron_mtp.config.parallel_sizes import grid_refusal
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.launch.container_mounts import Mount, container_path, parse_mounts
from megatron_mtp.launch.slurm_time import format_seconds, parse_slurm_time
from megatron_mtp.launch.submit_request import SubmitRequest

__all__ = ["JobPlan", "SubmitRequest", "build_plan", "check_memory"]

# Variables the job script itself sets for rendezvous; --env must not fight them.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEPENDENCY_ITEM = re.compile(
    r"^(singleton|(after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+(_\d+)?(\+\d+)?)+)$"
)
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")


@dataclass
class JobPlan:
    """A validated submission: everything the sbatch script is rendered from. The request's own
    fields (partition, time, resume, ...) are read through it; the plan holds what it resolves."""

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

    def __getattr__(self, name: str):
        # only called for names the plan does not hold: the request's fields
        if name.startswith("__") or name == "request":
            raise AttributeError(name)
        return getattr(self.request, name)

    @property
    def world_size(self) -> int:
        return self.nodes * self.tasks_per_node

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
    tasks_per_node, gpus_per_node = _resources(request)
    _check_words(request)
    time_seconds = parse_slurm_time(request.time) if request.time else None
    _check_signal(request, time_seconds)
    _check_resume(request)
    env = _parse_env(request.env)

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
        job_cfg, job_run_dir, job_workdir = _into_container(cfg, run_dir, workdir, mounts)
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
        time_seconds=time_seconds,
        job_name=request.job_name or f"mtp-{cfg.name}",
        container_mounts=mounts,
        env=env,
        python=python,
        workdir=workdir,
        job_workdir=job_workdir,
        resume_from=resume_from,
        memory=memory,
    )


def check_memory(cfg: Config, world: int, gpu: Optional[str], force: bool) -> str:
    """Refuse a GPU layout the memory plan predicts over the GPU's memory (unless forced); the verdict."""
    from megatron_mtp.plan.gpus import GIB, parse_gpu
    from megatron_mtp.plan.memory import make_plan, suggestions

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


# --------------------------------------------------------------------------- resources


def _resources(request: SubmitRequest) -> tuple[int, Optional[int]]:
    """(tasks per node, GPUs per node or None): one task per GPU, or --tasks-per-node with --cpu."""
    if request.nodes < 1:
        raise UserError(f"--nodes is {request.nodes}; ask for at least one node")
    if request.cpu:
        if request.gpus_per_node is not None:
            raise UserError(
                "--cpu and --gpus-per-node contradict each other; use --cpu --tasks-per-node N for CPU (gloo) jobs "
                "or --gpus-per-node G for GPU jobs"
            )
        tasks = 1 if request.tasks_per_node is None else request.tasks_per_node
        if tasks < 1:
            raise UserError(f"--tasks-per-node is {tasks}; run at least one task per node")
        return tasks, None
    if request.gpus_per_node is None:
        raise UserError(
            "say how many GPUs each node has with --gpus-per-node G (one training process runs per GPU), "
            "or pass --cpu for a CPU (gloo) job"
        )
    if request.gpus_per_node < 1:
        raise UserError(
            f"--gpus-per-node is {request.gpus_per_node}; give at least 1, or pass --cpu for a CPU (gloo) job"
        )
    if request.tasks_per_node is not None and request.tasks_per_node != request.gpus_per_node:
        raise UserError(
            "--tasks-per-node is only for --cpu jobs; GPU jobs always run one task per GPU, "
            "so drop it or make it equal to --gpus-per-node"
        )
    return request.gpus_per_node, request.gpus_per_node


def _check_words(request: SubmitRequest) -> None:
    for flag, value in (("--partition", request.partition), ("--account", request.account), ("--qos", request.qos)):
        if value is not None and not _SAFE_WORD.match(value):
            raise UserError(
                f"{flag} '{value}' has characters Slurm does not accept there; "
                "use the plain name (letters, digits, '_', '-', ',')"
            )
    if request.job_name is not None and (not request.job_name or not re.match(r"^[A-Za-z0-9_.+-]+$", request.job_name)):
        raise UserError(f"--job-name '{request.job_name}' must be a non-empty word of letters, digits and . _ + -")
    if request.dependency is not None:
        for item in re.split(r"[,?]", request.dependency):
            if not _DEPENDENCY_ITEM.match(item):
                raise UserError(
                    f"--dependency '{request.dependency}' is not a Slurm dependency; "
                    "use forms like afterok:123456, afterany:12:34 or singleton"
                )
    if request.cpus_per_task is not None and request.cpus_per_task < 1:
        raise UserError(f"--cpus-per-task is {request.cpus_per_task}; give at least 1")
    for arg in request.sbatch_args:
        if not arg.startswith("--") or "\n" in arg or not arg[2:3].isalpha():
            raise UserError(f"--sbatch-arg '{arg}' must be one long sbatch option such as --exclusive or --mem=0")
    if request.container_image is not None and (
        not request.container_image.strip() or any(c.isspace() for c in request.container_image)
    ):
        raise UserError(
            f"--container-image '{request.container_image}' must be an image name or .sqsh path without spaces"
        )


def _check_signal(request: SubmitRequest, time_seconds: Optional[int]) -> None:
    if not 10 <= request.signal_before <= 65535:
        raise UserError(
            f"--signal-before is {request.signal_before} s; Slurm accepts 10..65535 seconds before the time limit"
        )
    if time_seconds is not None and request.signal_before >= time_seconds:
        raise UserError(
            f"--signal-before {request.signal_before} s is not shorter than --time {request.time} "
            f"({format_seconds(time_seconds)}); ask for more --time or give a smaller --signal-before"
        )


def _check_resume(request: SubmitRequest) -> None:
    if request.resume not in ("requeue", "chain", "none"):
        raise UserError(f"--resume '{request.resume}' is unknown; use requeue, chain or none")
    if request.chain < 1:
        raise UserError(f"--chain is {request.chain}; a chain has at least one job")
    if request.chain > 1 and request.resume != "chain":
        raise UserError("--chain N only applies with --resume chain; add --resume chain or drop --chain")
    if request.max_restarts < 0:
        raise UserError(f"--max-restarts is {request.max_restarts}; give 0 or more")


def _parse_env(items: list[str]) -> dict[str, str]:
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not _ENV_KEY.match(key):
            raise UserError(f"--env '{item}' must look like NAME=value with NAME a shell variable name")
        if key in RESERVED_ENV:
            raise UserError(
                f"--env {key} is set by the job from the Slurm environment; drop it "
                f"(the job derives {', '.join(RESERVED_ENV)})"
            )
        if "\n" in value:
            raise UserError(f"--env {key} holds a newline; give a one-line value")
        env[key] = value
    return env


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
    from megatron_mtp.plan.default_corpus_rule import default_corpus_refusal

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


# --------------------------------------------------------------------------- container


def _into_container(cfg: Config, run_dir: str, workdir: str, mounts: list[Mount]) -> tuple[Config, str, str]:
    """Rewrite every path the job uses to its container-side name; UserError if one is not mounted."""
    home = os.path.expanduser("~")

    def inside(path: str, what: str, writable: bool = False) -> str:
        target = container_path(path, mounts, home)
        if target is None:
            raise UserError(
                f"{what} '{path}' is not under any --container-mounts source, so the job could not see it; "
                f"add a mount such as {os.path.dirname(os.path.abspath(path))}:"
                f"{os.path.dirname(os.path.abspath(path))}"
            )
        if writable:
            for m in mounts:
                if "ro" in m.flags.split("+") and (os.path.abspath(path) + "/").startswith(m.source.rstrip("/") + "/"):
                    raise UserError(
                        f"{what} '{path}' is under the read-only mount {m.spec()}; "
                        "the job must write there, so mount it read-write"
                    )
        return target

    job_cfg = copy.deepcopy(cfg)
    d = job_cfg.data
    d.paths = [inside(p, "data.paths entry") for p in d.paths] if d.paths else d.paths
    d.valid_paths = [inside(p, "data.valid_paths entry") for p in d.valid_paths] if d.valid_paths else d.valid_paths
    if d.tokenizer is not None:
        d.tokenizer = inside(d.tokenizer, "data.tokenizer")
    if d.cache_dir is not None:
        d.cache_dir = inside(d.cache_dir, "data.cache_dir", writable=True)
    if job_cfg.checkpoint.load is not None:
        job_cfg.checkpoint.load = inside(job_cfg.checkpoint.load, "checkpoint.load")
    job_run_dir = inside(run_dir, "run directory", writable=True)
    job_workdir = container_path(workdir, mounts, home) or job_run_dir
    return job_cfg, job_run_dir, job_workdir
