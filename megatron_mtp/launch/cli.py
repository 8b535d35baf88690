"""`megatron-mtp submit`: one command from a config to a queued, self-resuming Slurm job.

Only parses arguments; validation lives in job_plan.py, the script in sbatch_script.py, the
run-directory files and sbatch call in submit.py. No torch import here.
"""

from __future__ import annotations

import argparse
import sys

from megatron_mtp.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "submit",
        help="submit a multi-node training job to Slurm (auto-resumes across time limits and preemption)",
        description=(
            "Validate the run, write a readable sbatch script into RUN_DIR/slurm/ and submit it. "
            "The job runs one training process per GPU (or --tasks-per-node processes with --cpu), "
            "saves and requeues itself when Slurm warns of the time limit or preempts it, and "
            "resumes from the latest checkpoint."
        ),
    )
    parser.add_argument("config", help="run config YAML (configs/tiny_cpu.yaml, ...)")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value",
                        help="dotted config overrides, applied after the YAML (write them right after CONFIG)")
    res = parser.add_argument_group("resources")
    res.add_argument("--nodes", type=int, default=1, help="nodes to allocate (default 1)")
    res.add_argument("--gpus-per-node", type=int, help="GPUs per node; one training process (task) runs per GPU")
    res.add_argument("--cpu", action="store_true",
                     help="CPU-only job: no GPUs requested, gloo backend, training.device=cpu")
    res.add_argument("--tasks-per-node", type=int, help="with --cpu: training processes per node (default 1)")
    res.add_argument("--cpus-per-task", type=int, help="CPU cores per training process (sets OMP_NUM_THREADS too)")
    slurm = parser.add_argument_group("slurm")
    slurm.add_argument("--partition", help="Slurm partition")
    slurm.add_argument("--account", help="Slurm account to charge")
    slurm.add_argument("--qos", help="Slurm quality of service")
    slurm.add_argument("--time", help="time limit per job: minutes, HH:MM:SS or D-HH:MM:SS")
    slurm.add_argument("--job-name", help="job name (default mtp-<config name>)")
    slurm.add_argument("--dependency", help="Slurm dependency of the (first) job, e.g. afterok:123456")
    slurm.add_argument("--sbatch-arg", dest="sbatch_args", action="append", default=[], metavar="--OPTION[=VALUE]",
                       help="extra sbatch option written into the script (repeatable), e.g. --sbatch-arg=--exclusive")
    cont = parser.add_argument_group("container (pyxis/enroot)")
    cont.add_argument("--container-image", help="container image for every rank (pyxis --container-image)")
    cont.add_argument("--container-mounts", action="append", default=[], metavar="SRC[:DST[:ro]],...",
                      help="host paths to mount into the container (repeatable); run dir and data must be under one")
    cont.add_argument("--python",
                      help="interpreter that runs megatron_mtp in the job "
                           "(default: this one; 'python' in a container)")
    env = parser.add_argument_group("environment and resume")
    env.add_argument("--env", action="append", default=[], metavar="NAME=value",
                     help="environment variable for every rank (repeatable), e.g. NCCL_IB_HCA=mlx5")
    env.add_argument("--resume", choices=["requeue", "chain", "none"], default="requeue",
                     help="after a save-and-exit: requeue the same job (default), "
                          "let the next job of a --chain run, or stop")
    env.add_argument("--chain", type=int, default=1, help="with --resume chain: number of dependent jobs to queue")
    env.add_argument("--signal-before", type=int, default=300, metavar="SECONDS",
                     help="ask Slurm for the save signal this many seconds before the time limit (default 300)")
    env.add_argument("--max-restarts", type=int, default=50,
                     help="stop requeueing after this many restarts (default 50)")
    parser.add_argument("--run-dir",
                        help="run directory on a filesystem all nodes share (default ./runs/<config name>)")
    parser.add_argument("--dry-run", action="store_true",
                        help="validate and print the job script; submit nothing, write nothing")
    parser.add_argument("--gpu", help="GPU the memory plan checks the layout against: h100 (default), h200, b200 "
                                      "or GiB per GPU; --cpu jobs are not checked")
    parser.add_argument("--force", action="store_true",
                        help="submit even if the memory plan predicts a rank over the GPU's memory")
    parser.set_defaults(func=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    from megatron_mtp.launch.job_plan import SubmitRequest, build_plan
    from megatron_mtp.launch.submit import script_text, submit

    for item in args.overrides:
        if "=" not in item:
            raise UserError(
                f"'{item}' is neither an option nor a key.path=value override; "
                "check the spelling of the command line"
            )
    request = SubmitRequest(
        config=args.config,
        overrides=list(args.overrides),
        run_dir=args.run_dir,
        nodes=args.nodes,
        gpus_per_node=args.gpus_per_node,
        cpu=args.cpu,
        tasks_per_node=args.tasks_per_node,
        cpus_per_task=args.cpus_per_task,
        partition=args.partition,
        account=args.account,
        qos=args.qos,
        time=args.time,
        job_name=args.job_name,
        dependency=args.dependency,
        container_image=args.container_image,
        container_mounts=list(args.container_mounts),
        env=list(args.env),
        signal_before=args.signal_before,
        resume=args.resume,
        chain=args.chain,
        max_restarts=args.max_restarts,
        python=args.python,
        sbatch_args=list(args.sbatch_args),
        gpu=args.gpu,
        force=args.force,
    )
    plan = build_plan(request)
    if plan.memory:
        print(plan.memory, file=sys.stderr if args.dry_run else sys.stdout)
    if args.dry_run:
        print(script_text(plan), end="")
        return 0
    result = submit(plan)
    ids = ", ".join(result.job_ids)
    print(f"submitted job {ids} ({plan.nodes} node(s) x {plan.tasks_per_node} task(s) = {plan.world_size} ranks)")
    print(
        f"run directory:  {plan.run_dir} "
        f"({'resumes from ' + plan.resume_from if plan.resume_from else 'starts from scratch'})"
    )
    print(f"job script:     {result.script_path}")
    print(f"batch log:      {result.batch_log.replace('JOBID', result.job_ids[0])}")
    print(f"rank logs:      {result.rank_logs.replace('JOBID', result.job_ids[0])}")
    print(f"follow it with: squeue -j {ids}   |   stop it with: scancel {ids}")
    return 0
