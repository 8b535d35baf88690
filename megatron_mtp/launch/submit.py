"""Write a JobPlan's files into the run directory and hand the job to sbatch.

Layout under RUN_DIR (the trainer owns the rest, see the contracts in README.md):
  slurm/config.yaml   resolved config snapshot the job trains with (paths as the job sees them)
  slurm/job.sbatch    the job script as submitted (resubmit it with plain sbatch to continue)
  slurm/jobs.tsv      one line per submitted job: job id, UTC time, nodes x tasks
  slurm/chain.txt     chain mode: the chain's job ids in order
  logs/slurm-JOBID.out                         the batch shell's log (all restarts, appended)
  logs/slurm-JOBID/restart-R/rank-T.log        each rank's output, per restart

Nothing that claims a submission exists (job.sbatch, jobs.tsv) is written before sbatch accepted
the job; files are written under temporary names and renamed, and a refused submission removes
what it created.
"""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from megatron_mtp.errors import UserError
from megatron_mtp.launch.job_plan import JobPlan
from megatron_mtp.launch.sbatch_script import CHAIN_FILE, render_sbatch

_ACTIVE_STATES = {
    "PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "SUSPENDED",
    "RESIZING", "SIGNALING", "STAGE_OUT",
}


@dataclass
class SubmitResult:
    job_ids: list[str]
    script_path: str
    batch_log: str
    """Path pattern of the batch shell's log (one per job id)."""
    rank_logs: str
    """Path pattern of the per-rank logs."""


def script_text(plan: JobPlan) -> str:
    return render_sbatch(plan)


def submit(plan: JobPlan, sbatch: str = "sbatch") -> SubmitResult:
    """Write the snapshot and script, submit (a chain of) job(s), record the job ids."""
    sbatch_path = shutil.which(sbatch)
    if sbatch_path is None:
        raise UserError(
            f"'{sbatch}' was not found on PATH; run submit on a Slurm login node, "
            "or use --dry-run to only print the job script"
        )
    slurm_dir = os.path.join(plan.run_dir, "slurm")
    _refuse_if_active(slurm_dir)

    created = [d for d in (plan.run_dir, slurm_dir, os.path.join(plan.run_dir, "logs")) if not os.path.isdir(d)]
    for d in created:
        os.makedirs(d, exist_ok=True)
    snapshot_existed = os.path.exists(plan.snapshot_path)
    previous_snapshot = _read(plan.snapshot_path) if snapshot_existed else None
    _write_atomic(plan.snapshot_path, plan.config.to_yaml())
    text = script_text(plan)
    fd, tmp_script = tempfile.mkstemp(prefix=".job.", suffix=".sbatch.tmp", dir=slurm_dir)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp_script, 0o644)  # readable by colleagues sharing the run directory

    job_ids: list[str] = []
    try:
        for link in range(plan.request.chain if plan.request.resume == "chain" else 1):
            extra = [f"--dependency=afterany:{job_ids[-1]}"] if link else []
            job_ids.append(_sbatch(sbatch_path, extra, tmp_script))
            if plan.request.resume == "chain":
                _write_atomic(os.path.join(slurm_dir, CHAIN_FILE), "".join(f"{j}\n" for j in job_ids))
    except UserError:
        os.unlink(tmp_script)
        if job_ids:  # part of a chain got in: cancel it rather than leave half a chain
            subprocess.run(["scancel", *job_ids], check=False, capture_output=True)
            chain = os.path.join(slurm_dir, CHAIN_FILE)
            if os.path.exists(chain):
                os.unlink(chain)
        if previous_snapshot is not None:
            _write_atomic(plan.snapshot_path, previous_snapshot)
        elif os.path.exists(plan.snapshot_path):
            os.unlink(plan.snapshot_path)
        for d in reversed(created):
            try:
                os.rmdir(d)
            except OSError:
                pass
        raise

    script_path = os.path.join(slurm_dir, "job.sbatch")
    os.replace(tmp_script, script_path)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    with open(os.path.join(slurm_dir, "jobs.tsv"), "a", encoding="utf-8") as fh:
        for job_id in job_ids:
            fh.write(f"{job_id}\t{stamp}\t{plan.request.nodes}x{plan.tasks_per_node}\n")
    return SubmitResult(
        job_ids=job_ids,
        script_path=script_path,
        batch_log=os.path.join(plan.run_dir, "logs", "slurm-JOBID.out"),
        rank_logs=os.path.join(plan.run_dir, "logs", "slurm-JOBID", "restart-R", "rank-T.log"),
    )


def _sbatch(sbatch_path: str, extra: list[str], script: str) -> str:
    proc = subprocess.run([sbatch_path, "--parsable", *extra, script], capture_output=True, text=True)
    if proc.returncode != 0:
        message = (
            " ".join(line.strip() for line in proc.stderr.splitlines() if line.strip())
            or f"exit code {proc.returncode}"
        )
        raise UserError(f"sbatch refused the job ({message}); fix the Slurm options and submit again")
    job_id = proc.stdout.strip().split(";")[0]
    if not job_id.isdigit():
        raise UserError(f"sbatch answered '{proc.stdout.strip()}' instead of a job id; check the Slurm client setup")
    return job_id


def _refuse_if_active(slurm_dir: str) -> None:
    """Two jobs training into one run directory would overwrite each other's checkpoints."""
    jobs_file = os.path.join(slurm_dir, "jobs.tsv")
    if not os.path.exists(jobs_file) or shutil.which("squeue") is None:
        return
    ids = [line.split("\t")[0] for line in _read(jobs_file).splitlines() if line.strip()]
    if not ids:
        return
    proc = subprocess.run(["squeue", "-h", "-o", "%i %T", "-j", ",".join(ids[-20:])], capture_output=True, text=True)
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1] in _ACTIVE_STATES:
            raise UserError(
                f"job {parts[0]} is still {parts[1].lower()} in run directory {os.path.dirname(slurm_dir)}; "
                f"wait for it or `scancel {parts[0]}` before submitting another job there"
            )


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as fh:
        return fh.read()


def _write_atomic(path: str, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=os.path.dirname(path))
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(text)
    os.chmod(tmp, 0o644)
    os.replace(tmp, path)
