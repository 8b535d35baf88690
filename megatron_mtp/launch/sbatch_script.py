"""Render the sbatch script for a JobPlan: a readable bash file a user can inspect and resubmit.

Shape of the job (see README.md for the reasons):
  * one Slurm task per GPU (``--ntasks-per-node=G``), or ``--tasks-per-node`` tasks with ``--cpu``;
    each task maps SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID to RANK/WORLD_SIZE/LOCAL_RANK itself;
  * MASTER_ADDR is the first host of the allocation, MASTER_PORT is derived from the job id (and
    the restart count, so a requeued run never meets its predecessor's socket);
  * the batch shell traps USR1 (the ``--signal=B:USR1@N`` warning) and TERM (preemption) and
    forwards them to ``srun``, which forwards them to every rank; the trainer saves and exits 75
    (errors.EXIT_RESUME);
  * exit 75 -> ``scontrol requeue`` (or, in chain mode, let the next job of the chain run);
    exit 0 -> finished; exit 2 (an error the trainer reported) -> the job fails; anything else (a rank
    that died or hung, training/watchdog.py) -> requeue, up to --max-restarts, like after a signal.
"""

from __future__ import annotations

import datetime
import shlex

from megatron_mtp.errors import EXIT_RESUME, EXIT_USAGE
from megatron_mtp.launch.job_plan import JobPlan
from megatron_mtp.platform.job_env import gpu_job_env

CHAIN_FILE = "chain.txt"
"""In chain mode: the job ids of the chain, one per line, written under RUN_DIR/slurm/ by submit."""


def render_sbatch(plan: JobPlan) -> str:
    """The complete job script."""
    return "\n".join(
        _header(plan)
        + _directives(plan)
        + [""]
        + _preamble(plan)
        + _rendezvous(plan)
        + _environment(plan)
        + _signals()
        + _launch(plan)
        + _outcome(plan)
    ) + "\n"


def _header(plan: JobPlan) -> list[str]:
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mode = {
        "requeue": "requeues itself after a save-and-exit (time limit warning, preemption)",
        "chain": f"is one of a chain of {plan.request.chain} dependent jobs; the next one resumes after a "
                 "save-and-exit",
        "none": "does not resume by itself; resubmit it to continue",
    }[plan.request.resume]
    devices = (
        f"{plan.gpus_per_node} GPU(s), one task per GPU"
        if not plan.cpu
        else f"CPU only, {plan.tasks_per_node} task(s), gloo"
    )
    return [
        "#!/bin/bash",
        f"# megatron-mtp training job, written by `megatron-mtp submit` at {stamp}.",
        f"# Run directory:   {plan.run_dir}",
        f"# Config snapshot: {plan.snapshot_path}",
        f"# Layout: {plan.request.nodes} node(s) x {devices} = {plan.world_size} ranks.",
        f"# This job {mode}.",
        "# Submitting this file again resumes the run from its latest checkpoint.",
    ]


def _directives(plan: JobPlan) -> list[str]:
    logs = f"{plan.run_dir}/logs/slurm-%j.out"
    lines = [
        f"#SBATCH --job-name={plan.job_name}",
        f"#SBATCH --nodes={plan.request.nodes}",
        f"#SBATCH --ntasks-per-node={plan.tasks_per_node}",
    ]
    if plan.gpus_per_node is not None:
        lines.append(f"#SBATCH --gpus-per-node={plan.gpus_per_node}")
    if plan.request.cpus_per_task is not None:
        lines.append(f"#SBATCH --cpus-per-task={plan.request.cpus_per_task}")
    for flag, value in (
        ("time", plan.request.time),
        ("partition", plan.request.partition),
        ("account", plan.request.account),
        ("qos", plan.request.qos),
        ("dependency", plan.request.dependency),
    ):
        if value:
            lines.append(f"#SBATCH --{flag}={value}")
    lines += [
        f"#SBATCH --chdir={plan.workdir}",
        f"#SBATCH --output={logs}",
        "#SBATCH --open-mode=append",
        f"#SBATCH --signal=B:USR1@{plan.request.signal_before}",
    ]
    lines.append("#SBATCH --requeue" if plan.request.resume == "requeue" else "#SBATCH --no-requeue")
    lines += [f"#SBATCH {arg}" for arg in plan.request.sbatch_args]
    return lines


def _preamble(plan: JobPlan) -> list[str]:
    return [
        "set -uo pipefail",
        f"RUN_DIR={shlex.quote(plan.run_dir)}",
        "RESTART=${SLURM_RESTART_COUNT:-0}",
        'say() { echo "[megatron-mtp $(date -u +%H:%M:%S)] $*"; }',
        'say "job ${SLURM_JOB_ID} starts on ${SLURM_JOB_NODELIST}; SLURM_RESTART_COUNT=${RESTART}"',
        "",
    ]


def _rendezvous(plan: JobPlan) -> list[str]:
    return [
        "# ---- Rendezvous: rank 0 runs on the first node; the port follows the job id and restart count.",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "export MASTER_PORT=$(( 20000 + (SLURM_JOB_ID % 10000) * 4 + RESTART % 4 ))",
        'say "rendezvous at ${MASTER_ADDR}:${MASTER_PORT}"',
        "",
    ]


def _environment(plan: JobPlan) -> list[str]:
    lines = ["# ---- Communication and threading defaults (each one can be overridden with --env NAME=value)."]
    if plan.cpu:
        threads = plan.request.cpus_per_task or 1
        lines += [f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{threads}}}"']
    else:
        for name, value, why in gpu_job_env(plan.config):
            lines += [f"# {why}", f'export {name}="${{{name}:-{value}}}"']
        lines += [f'export OMP_NUM_THREADS="${{OMP_NUM_THREADS:-{plan.request.cpus_per_task or 4}}}"']
    if plan.env:
        lines.append("# ---- User settings (--env).")
        lines += [f"export {key}={shlex.quote(value)}" for key, value in plan.env.items()]
    lines.append("")
    return lines


def _signals() -> list[str]:
    return [
        "# ---- Save-and-exit: USR1 arrives --signal-before seconds ahead of the time limit, TERM on",
        "# preemption or scancel. srun passes both on to every rank; the trainer finishes the step,",
        f"# all ranks save a checkpoint together and exit {EXIT_RESUME}.",
        'SRUN_PID=""',
        "SIGNALLED=\"\"",
        'forward() { SIGNALLED=$1; say "received SIG$1; asking the trainer to save and exit"; '
        '[ -n "$SRUN_PID" ] && kill -s "$1" "$SRUN_PID" 2>/dev/null; }',
        "trap 'forward USR1' USR1",
        "trap 'forward TERM' TERM",
        "",
    ]


def _launch(plan: JobPlan) -> list[str]:
    srun = [
        "srun",
        "--kill-on-bad-exit=0",
        "--wait=60",  # once a rank has ended, the others get 60 s (a stopped rank is then killed)
        '--output="$LOG_DIR/rank-%t.log"',
    ]
    container = _container_flags(plan)
    srun += container
    rank_env = (
        "'export RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID "
        "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE; exec \"$@\"' rank-env"
    )
    train = [
        shlex.quote(plan.python), "-m", "megatron_mtp", "train", shlex.quote(plan.job_snapshot_path),
        "--run-dir", shlex.quote(plan.job_run_dir),
    ]
    check = ["srun", "--nodes=1", "--ntasks=1", *container, shlex.quote(plan.python), "-m",
             "megatron_mtp.launch.env_check", *([] if plan.cpu else ["--te"])]
    lines = [
        "# ---- Environment: torch, megatron-core (and Transformer Engine on GPUs) in the tested ranges,",
        "# checked where the ranks will run (inside the image), before any rank starts.",
        " ".join(check) + " || "
        f'{{ say "the job environment is not one megatron-mtp is tested on (above); not starting training"; '
        f"exit {EXIT_USAGE}; }}",
        "",
        "# ---- Launch: one task per rank; each maps the Slurm task ids to torch.distributed's names.",
        "# srun writes the rank logs on the host side (outside any container).",
        'LOG_DIR="$RUN_DIR/logs/slurm-${SLURM_JOB_ID}/restart-${RESTART}"',
        'mkdir -p "$LOG_DIR"',
        'say "per-rank logs: $LOG_DIR/rank-<rank>.log"',
        " \\\n    ".join(srun) + " \\",
        f"    bash -c {rank_env} \\",
        "    " + " ".join(train) + " &",
        "SRUN_PID=$!",
        "# wait returns early whenever a trapped signal arrives; keep waiting until srun is gone.",
        'while :; do wait "$SRUN_PID"; RC=$?; kill -0 "$SRUN_PID" 2>/dev/null || break; done',
        'if [ "$RC" -gt 128 ]; then wait "$SRUN_PID"; LAST=$?; [ "$LAST" -ne 127 ] && RC=$LAST; fi',
        "",
    ]
    return lines


def _container_flags(plan: JobPlan) -> list[str]:
    if not plan.request.container_image:
        return []
    flags = [f"--container-image={shlex.quote(plan.request.container_image)}"]
    mounts = ",".join(m.spec() for m in plan.container_mounts)
    if mounts:
        flags.append(f"--container-mounts={shlex.quote(mounts)}")
    return flags + [f"--container-workdir={shlex.quote(plan.job_workdir)}"]


def _outcome(plan: JobPlan) -> list[str]:
    lines = [f"# ---- Outcome: 0 = finished, {EXIT_RESUME} = saved and wants to resume, anything else = failure."]
    if plan.request.resume == "chain":
        chain = f"{plan.run_dir}/slurm/{CHAIN_FILE}"
        lines += [
            "cancel_rest_of_chain() {",
            f"    local later; later=$(awk -v me=\"$SLURM_JOB_ID\" 'seen {{print}} $1 == me {{seen = 1}}' "
            f"{shlex.quote(chain)} 2>/dev/null | tr '\\n' ' ')",
            '    if [ -n "$later" ]; then say "cancelling the rest of the chain: $later"; scancel $later; fi',
            "}",
        ]
    lines += ['case "$RC" in', '  0)', '    say "training finished"']
    if plan.request.resume == "chain":
        lines.append("    cancel_rest_of_chain")
    lines += ["    exit 0 ;;", f"  {EXIT_RESUME})"]
    if plan.request.resume == "requeue":
        lines += [
            f'    if [ "$RESTART" -ge {plan.request.max_restarts} ]; then',
            f'        say "checkpoint saved; not requeueing: already restarted {plan.request.max_restarts} time(s) '
            f'(--max-restarts)"; exit {EXIT_RESUME}',
            "    fi",
            '    say "checkpoint saved; requeueing job ${SLURM_JOB_ID} (restart $((RESTART + 1)))"',
            '    scontrol requeue "$SLURM_JOB_ID" || '
            '{ say "scontrol requeue failed; resubmit this script to continue"; exit ' + str(EXIT_RESUME) + "; }",
            "    exit 0 ;;",
        ]
    elif plan.request.resume == "chain":
        lines += ['    say "checkpoint saved; the next job of the chain resumes"', "    exit 0 ;;"]
    else:
        lines += [f'    say "checkpoint saved; resubmit this script to continue"; exit {EXIT_RESUME} ;;']
    if plan.request.resume == "requeue":
        # A signal that lands before the trainer installed its handler (start-up) kills a rank instead
        # of saving; a rank that dies (an Xid, an OOM kill, a lost node) or hangs (the trainer's
        # watchdog ends the job with 76) ends the job the same way. Checkpoints are written atomically,
        # so resuming from the last complete one is safe; a bad input (2) would fail again alike.
        lines += [
            f"  {EXIT_USAGE})",
            '    say "training stopped on an error it reported (exit code 2; see the per-rank logs); not requeueing"',
            "    exit 2 ;;",
            "  *)",
            f'    if [ "$RESTART" -lt {plan.request.max_restarts} ]; then',
            '        if [ -n "$SIGNALLED" ]; then why="after SIG$SIGNALLED"; '
            'else why="(a rank died or hung: see the per-rank logs)"; fi',
            '        say "training ended with exit code $RC $why; requeueing to resume from the latest complete '
            f'checkpoint (restart $((RESTART + 1)) of {plan.request.max_restarts})"',
            '        scontrol requeue "$SLURM_JOB_ID" && exit 0',
            "    fi",
            '    say "training failed with exit code $RC; see the per-rank logs"',
        ]
    else:
        lines += ["  *)", '    say "training failed with exit code $RC; see the per-rank logs"']
    if plan.request.resume == "chain":
        lines.append("    cancel_rest_of_chain")
    lines += ['    exit "$RC" ;;', "esac"]
    return lines
