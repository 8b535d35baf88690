"""The checks of ``megatron-mtp submit``'s own flags, before any config is read: resources, the words
passed on to Slurm, the signal, the resume policy and ``--env``. Each problem is one UserError
sentence naming the flag.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.errors import UserError
from megatron_mtp.launch.slurm_time import format_seconds, parse_slurm_time
from megatron_mtp.launch.submit_request import SubmitRequest

# Variables the job script itself sets for rendezvous; --env must not fight them.
RESERVED_ENV = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
_ENV_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_DEPENDENCY_ITEM = re.compile(
    r"^(singleton|(after|afterany|afterok|afternotok|aftercorr|afterburstbuffer)(:\d+(_\d+)?(\+\d+)?)+)$"
)
_SAFE_WORD = re.compile(r"^[A-Za-z0-9_.,:@%+=/-]+$")


@dataclass(frozen=True)
class CheckedRequest:
    """What the flags resolve to on their own."""

    tasks_per_node: int
    """Processes per node: one per GPU, or --tasks-per-node with --cpu."""
    gpus_per_node: Optional[int]
    """GPUs per node; None for a CPU (gloo) job."""
    time_seconds: Optional[int]
    """--time in seconds; None when not given."""
    env: dict[str, str]
    """--env NAME=value pairs."""


def check_request(request: SubmitRequest) -> CheckedRequest:
    """Check the flags of ``request`` that need no config; raise UserError on the first problem."""
    tasks_per_node, gpus_per_node = _resources(request)
    _check_words(request)
    time_seconds = parse_slurm_time(request.time) if request.time else None
    _check_signal(request, time_seconds)
    _check_resume(request)
    return CheckedRequest(tasks_per_node, gpus_per_node, time_seconds, _parse_env(request.env))


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
