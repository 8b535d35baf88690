"""`megatron-mtp submit`: one command from a config to a queued, self-resuming Slurm job.

Only parses arguments; validation lives in job_plan.py, the script in sbatch_script.py, the
run-directory files and sbatch call in submit.py. No torch import here.
"""

from __future__ import annotations

import argparse
import sys

from megatron_mtp.errors import UserError
from megatron_mtp.launch.submit_request import SubmitRequest, add_arguments


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
    add_arguments(parser)
    parser.add_argument("--dry-run", action="store_true",
                        help="validate and print the job script; submit nothing, write nothing")
    parser.set_defaults(func=run_submit)


def run_submit(args: argparse.Namespace) -> int:
    from megatron_mtp.launch.job_plan import build_plan
    from megatron_mtp.launch.submit import script_text, submit

    for item in args.overrides:
        if "=" not in item:
            raise UserError(
                f"'{item}' is neither an option nor a key.path=value override; "
                "check the spelling of the command line"
            )
    request = SubmitRequest.from_args(args)
    plan = build_plan(request)
    if plan.memory:
        print(plan.memory, file=sys.stderr if args.dry_run else sys.stdout)
    if args.dry_run:
        print(script_text(plan), end="")
        return 0
    result = submit(plan)
    ids = ", ".join(result.job_ids)
    print(f"submitted job {ids} ({plan.request.nodes} node(s) x {plan.tasks_per_node} task(s) = "
          f"{plan.world_size} ranks)")
    print(
        f"run directory:  {plan.run_dir} "
        f"({'resumes from ' + plan.resume_from if plan.resume_from else 'starts from scratch'})"
    )
    print(f"job script:     {result.script_path}")
    print(f"batch log:      {result.batch_log.replace('JOBID', result.job_ids[0])}")
    print(f"rank logs:      {result.rank_logs.replace('JOBID', result.job_ids[0])}")
    print(f"follow it with: squeue -j {ids}   |   stop it with: scancel {ids}")
    return 0
