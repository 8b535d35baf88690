"""`megatron-mtp submit` refuses bad submissions before sbatch, and writes only after sbatch accepts.

Fast: no cluster. A stand-in `sbatch` (and `squeue`) on PATH records whether it was ever called.
"""

from __future__ import annotations

import itertools
import os
import stat
import subprocess

import pytest

from megatron_mtp.checkpoint.run_dir import write_manifest
from megatron_mtp.cli import main
from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.launch.job_plan import SubmitRequest, build_plan
from megatron_mtp.launch.sbatch_script import render_sbatch
from megatron_mtp.launch.slurm_time import parse_slurm_time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(REPO, "configs", "tiny_cpu.yaml")


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """sbatch/squeue stand-ins on PATH; sbatch answers job id 4242 (or fails when SBATCH_FAIL is set)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    calls = tmp_path / "sbatch-calls"
    (bin_dir / "sbatch").write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'if [ -n "$SBATCH_FAIL" ]; then echo "sbatch: error: invalid partition specified: nope" >&2; exit 1; fi\n'
        "echo 4242\n"
    )
    (bin_dir / "squeue").write_text('#!/bin/sh\n[ -n "$SQUEUE_ACTIVE" ] && echo "4242 RUNNING"\nexit 0\n')
    for f in bin_dir.iterdir():
        f.chmod(f.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(tmp_path)
    return calls


def _submit(args: list[str], capsys) -> tuple[int, str, str]:
    rc = main(["submit", *args])
    out, err = capsys.readouterr()
    return rc, out, err


BAD = [
    (["--nodes", "1", "--cpu", "--tasks-per-node", "3", "parallel.tensor=2"], "not a multiple of tensor × pipeline"),
    (["--nodes", "2", "--cpu", "--tasks-per-node", "2", "parallel.world_size=8"], "parallel.world_size=8"),
    (["--nodes", "3", "--cpu"], "global_batch_size=16 must be a multiple"),
    (["--nodes", "1", "--cpu", "--tasks-per-node", "6", "parallel.expert=4", "training.global_batch_size=48"],
     "expert tensor × expert × pipeline = 1×4×1 = 4"),
    (["--nodes", "1", "--cpu", "data.paths=[/nonexistent/corpus_text_document]"],
     "/nonexistent/corpus_text_document.bin"),
    (["--nodes", "1", "--cpu", "data.tokenizer=/nonexistent/tokenizer.json"], "data.tokenizer"),
    (["--nodes", "1", "--cpu", "checkpoint.load=/nonexistent/run"], "checkpoint.load"),
    (["--nodes", "1", "--cpu", "--container-mounts", "/tmp:/data"], "without --container-image"),
    (["--nodes", "1", "--gpus-per-node", "8", "training.global_batch_size=64",
      "--container-image", "nvcr.io/nvidia/pytorch:25.09-py3",
      "--container-mounts", "/usr:/usr", "--run-dir", "/tmp/elsewhere/run"],
     "is not under any --container-mounts source"),
    (["--nodes", "1", "--cpu", "--time", "ten minutes"], "is not a Slurm time limit"),
    (["--nodes", "1", "--cpu", "--time", "4", "--signal-before", "300"], "is not shorter than --time"),
    (["--nodes", "1", "--cpu", "--gpus-per-node", "8"], "contradict"),
    (["--nodes", "1"], "--gpus-per-node"),
    (["--nodes", "0", "--cpu"], "--nodes is 0"),
    (["--nodes", "1", "--gpus-per-node", "8", "training.device=cpu"], "training.device=cpu"),
    (["--nodes", "1", "--cpu", "parallel.backend=nccl"], "parallel.backend=nccl"),
    (["--nodes", "1", "--gpus-per-node", "8", "--tasks-per-node", "2"], "one task per GPU"),
    (["--nodes", "1", "--cpu", "--env", "RANK=3"], "set by the job"),
    (["--nodes", "1", "--cpu", "--env", "NO_EQUALS_SIGN"], "NAME=value"),
    (["--nodes", "1", "--cpu", "--dependency", "after 12"], "not a Slurm dependency"),
    (["--nodes", "1", "--cpu", "--partition", "gpu;rm -rf"], "--partition"),
    (["--nodes", "1", "--cpu", "--chain", "3"], "--resume chain"),
    (["--nodes", "1", "--cpu", "trainig.max_steps=5"], "did you mean 'training'"),
    (["--nodes", "1", "--cpu", "model.num_layers=5", "parallel.pipeline=2", "training.global_batch_size=16"],
     "not a multiple of tensor × pipeline"),
    (["--nodes", "2", "--cpu", "--sbatch-arg", "exclusive"], "--sbatch-arg"),
]


@pytest.mark.parametrize("args,fragment", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_submission_is_refused_before_sbatch(fake_slurm, tmp_path, capsys, args, fragment):
    run_dir = tmp_path / "run"
    overrides = [a for a in args if "=" in a and not a.startswith("-") and a.split("=")[0].islower()]
    options = [a for a in args if a not in overrides]  # argparse wants the overrides right after CONFIG
    if "--run-dir" not in options:
        options += ["--run-dir", str(run_dir)]
    rc, out, err = _submit([CONFIG, *overrides, *options], capsys)
    assert rc == 2
    assert err.startswith("megatron-mtp submit: error: ") and fragment in err, err
    assert err.count("\n") == 1, "one sentence on one line"
    assert not fake_slurm.exists(), "sbatch must not be called"
    assert not run_dir.exists(), "nothing may be written"


def test_recipe_layout_with_folded_experts_is_submitted(fake_slurm, tmp_path, capsys):
    """The Gemma 4 recipe's own TP2 × ETP1 × EP4 × PP2 on 8 GPUs: the experts' grid (1×4×2) folds over the
    dense one (2×2), so 8 processes fit both; submit must not ask for 16."""
    for ext in (".bin", ".idx"):
        (tmp_path / f"corpus{ext}").write_bytes(b"")
    rc, out, err = _submit([os.path.join(REPO, "configs", "gemma4_26b_a4b.yaml"), f"data.paths=[{tmp_path}/corpus]",
                            "--nodes", "1", "--gpus-per-node", "8", "--run-dir", str(tmp_path / "run"), "--dry-run"],
                           capsys)
    assert rc == 0, err
    assert "#SBATCH --ntasks-per-node=8" in out and not fake_slurm.exists()


def test_layout_that_fits_no_grid_is_refused_with_advice_on_the_job_size(fake_slurm, tmp_path, capsys):
    rc, _, err = _submit([CONFIG, "parallel.tensor=2", "parallel.expert=4", "parallel.expert_tensor=1",
                          "--nodes", "1", "--cpu", "--tasks-per-node", "2", "--run-dir", str(tmp_path / "run")],
                         capsys)
    assert rc == 2 and not fake_slurm.exists()
    assert ("2 processes is not a multiple of expert tensor × expert × pipeline = 1×4×1 = 4" in err
            and "change --nodes/--gpus-per-node" in err and "parallel.expert/expert_tensor" in err), err


def test_submit_accepts_exactly_the_layouts_the_config_rule_accepts(tmp_path):
    """Every (TP, ETP, EP, PP, processes) the trainer's validation (and so `plan`) accepts, submit accepts, and
    the ones it refuses, submit refuses: one rule, not two copies."""
    accepted = refused = 0
    for tp, etp, ep, pp, tasks in itertools.product((1, 2), (None, 1), (1, 2, 4), (1, 2), (2, 4, 6, 8)):
        overrides = [f"parallel.tensor={tp}", f"parallel.expert_tensor={'null' if etp is None else etp}",
                     f"parallel.expert={ep}", f"parallel.pipeline={pp}", "training.micro_batch_size=1",
                     "training.global_batch_size=24"]
        try:
            validate(load_config(CONFIG, overrides + ["training.device=cpu", "parallel.backend=gloo"]), tasks)
            valid = True
        except UserError:
            valid = False
        try:
            build_plan(SubmitRequest(config=CONFIG, overrides=overrides, nodes=1, cpu=True, tasks_per_node=tasks,
                                     run_dir=str(tmp_path / "run")))
            submitted = True
        except UserError:
            submitted = False
        assert submitted == valid, (overrides, tasks)
        accepted, refused = accepted + valid, refused + (not valid)
    assert accepted >= 20 and refused >= 20  # both sides of the rule were exercised


def test_run_dir_that_is_a_file_is_refused(fake_slurm, tmp_path, capsys):
    path = tmp_path / "run"
    path.write_text("not a directory")
    rc, _, err = _submit([CONFIG, "--cpu", "--run-dir", str(path)], capsys)
    assert rc == 2 and "is a file" in err and not fake_slurm.exists()


def test_dry_run_prints_the_script_and_writes_nothing(fake_slurm, tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, out, err = _submit([CONFIG, "training.max_steps=6", "training.global_batch_size=32", "--nodes", "2", "--cpu",
                            "--tasks-per-node", "2", "--time", "1:00:00", "--partition", "debug",
                            "--run-dir", str(run_dir), "--dry-run"], capsys)
    assert rc == 0, err
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=2", "#SBATCH --time=1:00:00",
                 "#SBATCH --partition=debug", "#SBATCH --signal=B:USR1@300", "#SBATCH --requeue",
                 f"#SBATCH --output={run_dir}/logs/slurm-%j.out", 'scontrol requeue "$SLURM_JOB_ID"',
                 "RANK=$SLURM_PROCID WORLD_SIZE=$SLURM_NTASKS LOCAL_RANK=$SLURM_LOCALID"):
        assert line in out, line
    assert "gpus-per-node" not in out and "NCCL" not in out
    assert subprocess.run(["bash", "-n"], input=out, text=True).returncode == 0
    assert not run_dir.exists() and not fake_slurm.exists()


def test_gpu_job_runs_one_task_per_gpu_with_nccl_settings(tmp_path):
    plan = build_plan(SubmitRequest(config=CONFIG, nodes=4, gpus_per_node=8, run_dir=str(tmp_path / "run"),
                                    env=["NCCL_IB_HCA=mlx5", "NCCL_DEBUG=INFO"],
                                    overrides=["training.global_batch_size=256"]))
    script = render_sbatch(plan)
    assert plan.world_size == 32
    assert "#SBATCH --gpus-per-node=8" in script and "#SBATCH --ntasks-per-node=8" in script
    assert 'export CUDA_DEVICE_MAX_CONNECTIONS="${CUDA_DEVICE_MAX_CONNECTIONS:-1}"' in script
    # user settings come after the defaults, so they win
    assert script.index("export NCCL_DEBUG=INFO") > script.index('export NCCL_DEBUG="${NCCL_DEBUG:-WARN}"')
    assert "export NCCL_IB_HCA=mlx5" in script


def test_container_paths_are_rewritten_to_the_mount_targets(tmp_path):
    host = tmp_path / "lustre"
    (host / "data").mkdir(parents=True)
    for ext in (".bin", ".idx"):
        (host / "data" / f"corpus{ext}").write_bytes(b"")
    plan = build_plan(SubmitRequest(
        config=CONFIG, nodes=2, gpus_per_node=8, run_dir=str(host / "runs" / "a"),
        overrides=[f"data.paths=[{host}/data/corpus]", "training.global_batch_size=128"],
        container_image="nvcr.io/nvidia/pytorch:25.09-py3", container_mounts=[f"{host}:/workspace"],
    ))
    assert plan.job_run_dir == "/workspace/runs/a" and plan.run_dir == str(host / "runs" / "a")
    assert plan.config.data.paths == ["/workspace/data/corpus"]
    script = render_sbatch(plan)
    assert f"--container-mounts={host}:/workspace" in script
    assert "python -m megatron_mtp train /workspace/runs/a/slurm/config.yaml --run-dir /workspace/runs/a" in script
    # rank logs are written by srun on the host, outside the container
    assert f"RUN_DIR={host}/runs/a" in script


def test_read_only_run_dir_mount_is_refused(tmp_path):
    (tmp_path / "ro").mkdir()
    with pytest.raises(UserError, match="read-only"):
        build_plan(SubmitRequest(config=CONFIG, gpus_per_node=1, run_dir=str(tmp_path / "ro" / "run"),
                                 container_image="img.sqsh", container_mounts=[f"{tmp_path}/ro:/ro:ro"]))


def test_submit_writes_script_snapshot_and_job_record(fake_slurm, tmp_path, capsys):
    run_dir = tmp_path / "run"
    rc, out, err = _submit([CONFIG, "training.max_steps=6", "--cpu", "--run-dir", str(run_dir)], capsys)
    assert rc == 0, err
    assert "submitted job 4242" in out and f"{run_dir}/logs/slurm-4242.out" in out
    script = (run_dir / "slurm" / "job.sbatch").read_text()
    assert script.startswith("#!/bin/bash") and str(run_dir / "slurm" / "config.yaml") in script
    assert "max_steps: 6" in (run_dir / "slurm" / "config.yaml").read_text()
    assert (run_dir / "slurm" / "jobs.tsv").read_text().startswith("4242\t")
    assert [p.name for p in (run_dir / "slurm").iterdir() if p.name.endswith(".tmp")] == []
    # a second submission while the first job still runs is refused
    os.environ["SQUEUE_ACTIVE"] = "1"
    try:
        rc, _, err = _submit([CONFIG, "--cpu", "--run-dir", str(run_dir)], capsys)
    finally:
        del os.environ["SQUEUE_ACTIVE"]
    assert rc == 2 and "job 4242 is still running" in err


def test_refused_sbatch_leaves_nothing_that_looks_submitted(fake_slurm, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("SBATCH_FAIL", "1")
    run_dir = tmp_path / "run"
    rc, _, err = _submit([CONFIG, "--cpu", "--partition", "nope", "--run-dir", str(run_dir)], capsys)
    assert rc == 2 and "sbatch refused the job (sbatch: error: invalid partition specified: nope)" in err
    assert fake_slurm.exists() and not run_dir.exists()


@pytest.mark.parametrize("text,seconds", [("90", 5400), ("10:30", 630), ("1:00:00", 3600), ("2-00", 172800),
                                          ("1-02:03", 93780), ("1-02:03:04", 93784), ("UNLIMITED", None)])
def test_slurm_time_formats(text, seconds):
    assert parse_slurm_time(text) == seconds


@pytest.mark.parametrize("text", ["", "1h", "1:2:3:4", "0", "-5", "1-", "99:99:99", "1:75", "2-25", "1-00:60"])
def test_bad_slurm_times(text):
    with pytest.raises(UserError):
        parse_slurm_time(text)


def _fake_checkpoint(run_dir, expert: int) -> None:
    step = run_dir / "checkpoints" / "step_0000010"
    step.mkdir(parents=True)
    (step / "train_state.json").write_text(
        '{"step": 10, "consumed_samples": 160, "consumed_tokens": 20480, "has_optimizer": true, "world_size": 2,'
        f' "parallel": {{"tensor": 1, "pipeline": 1, "expert": {expert}, "data": 2}}}}')
    for name in ("metadata.json", "config.yaml"):  # the rest of a complete checkpoint (contents unread here)
        (step / name).write_text("{}")
    write_manifest(step)
    (run_dir / "checkpoints" / "latest").write_text("step_0000010\n")


def test_resume_point_is_reported_and_an_unloadable_layout_refused(fake_slurm, tmp_path, capsys):
    run_dir = tmp_path / "run"
    _fake_checkpoint(run_dir, expert=1)
    rc, out, err = _submit([CONFIG, "--nodes", "2", "--cpu", "--run-dir", str(run_dir)], capsys)
    assert rc == 0, err
    assert f"resumes from {run_dir}/checkpoints/step_0000010" in out
    rc, _, err = _submit([CONFIG, "parallel.expert=2", "--nodes", "2", "--cpu", "--run-dir", str(run_dir)], capsys)
    assert rc == 2 and "expert parallel size 1" in err and fake_slurm.read_text().count("\n") == 1
