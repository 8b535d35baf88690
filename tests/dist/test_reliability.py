"""A diverged, doubled or half-broken run never loses good work, and every failure is one sentence."""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from megatron_mtp.errors import is_one_sentence
from tests.workers.pool import POOL

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
DIVERGE = ("optimizer.lr=1e4", "optimizer.clip_grad=0", "schedule.warmup_steps=0",
           "checkpoint.save_interval=1", "checkpoint.keep_last=1")


def _state(run: Path) -> dict:
    latest = (run / "checkpoints" / "latest").read_text().strip()
    return json.loads((run / "checkpoints" / latest / "train_state.json").read_text())


def _one_sentence(stderr: str, *needles: str) -> str:
    lines = [line for line in stderr.splitlines() if "error:" in line]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr[-3000:]
    assert is_one_sentence(lines[0].split(" error: ", 1)[1]), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def _eval(path: Path, *args: str) -> subprocess.CompletedProcess:
    return POOL.run(["-m", "megatron_mtp", "eval", str(path), *args], timeout=600)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_divergence_stops_with_a_finite_latest(tmp_path, train, precision):
    run = tmp_path / "run"
    proc = train(run, steps=30, overrides=(*DIVERGE, f"training.precision={precision}"), check=False)
    assert proc.returncode == 2
    line = _one_sentence(proc.stderr, "is not finite (NaN or Inf)", "the last checkpoint is")
    state = _state(run)
    assert state["weights_finite"] is True and state["step"] >= 1
    assert f"step_{state['step']:07d}" in line  # the sentence names the checkpoint `latest` keeps
    failed_step = int(line.split(" of step ")[1].split(" ")[0])
    assert failed_step == state["step"] + 1
    ok = _eval(run, "--json", "--steps", "1")  # the kept checkpoint is usable
    assert ok.returncode == 0, ok.stderr[-2000:]


def test_skip_mode_skips_the_bad_steps_and_continues(tmp_path, train, metrics):
    run = tmp_path / "run"
    warmup = ("schedule.warmup_steps=10", "training.on_nonfinite=skip")
    os.environ["MEGATRON_MTP_INJECT_NONFINITE"] = "3,4"
    try:
        proc = train(run, steps=6, overrides=warmup)
        stopped = train(tmp_path / "stop", steps=6, overrides=(*warmup, "training.max_skipped_steps=1"), check=False)
    finally:
        del os.environ["MEGATRON_MTP_INJECT_NONFINITE"]
    assert "skipped step 3" in proc.stdout and "skipped step 4" in proc.stdout
    rows = metrics(run)
    assert [r["train/skipped_steps"] for r in rows] == [0, 0, 1, 1, 0, 0]
    assert rows[2]["train/lm_loss"] is None  # strict JSON: no loss to report for a skipped step
    assert rows[4]["train/lr"] == pytest.approx(rows[1]["train/lr"] * 3 / 2)  # the LR schedule waits for real steps
    assert _state(run)["step"] == 6
    assert stopped.returncode == 2
    _one_sentence(stopped.stderr, "2 skipped steps in a row", "training.max_skipped_steps=1")


def test_loss_spike_rolls_back_to_the_last_good_checkpoint(tmp_path, train, metrics):
    run = tmp_path / "run"
    rule = ("training.loss_spike.factor=3", "training.loss_spike.patience=2", "training.loss_spike.window=4")
    spike = (*rule, "training.loss_spike.action=rollback", "checkpoint.save_interval=1", "checkpoint.keep_last=0")
    os.environ["MEGATRON_MTP_INJECT_SPIKE"] = "7-8"  # the rule sees 100 × the loss at steps 7 and 8
    try:
        proc = train(run, steps=10, overrides=spike)
        stop = train(tmp_path / "stop", steps=10, overrides=(*rule, "training.loss_spike.action=stop",
                                                             "checkpoint.save_interval=1"), check=False)
    finally:
        del os.environ["MEGATRON_MTP_INJECT_SPIKE"]
    assert "rolled back to" in proc.stdout and "step_0000006" in proc.stdout
    rows = [r for r in metrics(run) if "train/lm_loss" in r]
    # the rule fired at step 8 (two spiking steps): back to step 6, then 7..10 trained on new data
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5, 6, 7, 7, 8, 9, 10]
    assert rows[7].get("train/rolled_back_from_step") == 7
    assert (run / "checkpoints.rolled-back" / "step_0000007").is_dir()  # set aside, never resumed from
    assert _state(run)["step"] == 10 and _state(run)["consumed_samples"] == 12 * 8  # 2 steps of data skipped
    assert stop.returncode == 2
    _one_sentence(stop.stderr, "loss spike", "from step 7", "the last checkpoint is")


def test_run_without_or_with_a_dangling_latest_resumes_from_the_newest_complete_step(tmp_path, train):
    run = tmp_path / "run"
    train(run, steps=2, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    (run / "checkpoints" / "latest").unlink()
    again = train(run, steps=3, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    assert "using the newest complete checkpoint step_0000002" in again.stdout and "at step 2" in again.stdout
    (run / "checkpoints" / "latest").write_text("step_0000099\n")
    third = train(run, steps=4, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    assert "names 'step_0000099', which is not a complete checkpoint" in third.stdout and "at step 3" in third.stdout

    # latest names a step that lost a shard file (not metadata.json): eval and resume use step 3 and say why
    step = run / "checkpoints" / "step_0000004"
    shard = sorted(step.glob("*.distcp"))[-1]
    shard.unlink()
    direct = _eval(step)
    assert direct.returncode == 2
    _one_sentence(direct.stderr, f"checkpoint {step} is incomplete ({shard.name} missing); pass another checkpoint")
    note = f"names 'step_0000004', which is incomplete ({shard.name} missing); using the newest complete " \
           "checkpoint step_0000003"
    evaluated = _eval(run, "--json", "--steps", "1")
    assert evaluated.returncode == 0 and note in evaluated.stderr, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout.strip().splitlines()[-1])["checkpoint"] == str(run / "checkpoints" /
                                                                                      "step_0000003")
    fourth = train(run, steps=5, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    assert note in fourth.stdout and "at step 3" in fourth.stdout
    assert _state(run)["step"] == 5 and shard.is_file()  # step 4 saved again, whole

    # a shard overwritten in place (same size, so complete by the manifest) of a step saved before manifests
    # carried digests: eval names the damage in one sentence; the resume sets the step aside in
    # checkpoints.damaged/ and resumes from step 4, with a note
    step5 = run / "checkpoints" / "step_0000005"
    manifest = json.loads((step5 / "manifest.json").read_text())
    assert manifest["digest"] == "sha256" and set(manifest["digests"]) == set(manifest["files"]) - {
        "config.yaml", "train_state.json"}
    (step5 / "manifest.json").write_text(json.dumps({"files": manifest["files"]}))
    first = sorted(step5.glob("*.distcp"))[0]
    with open(first, "r+b") as fh:
        fh.write(b"\0" * 64)
    direct = _eval(step5)
    assert direct.returncode == 2
    _one_sentence(direct.stderr, f"checkpoint {step5} is damaged: reading it failed (")
    fifth = train(run, steps=6, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    assert "step_0000005 is damaged (reading it failed" in fifth.stdout and "at step 4" in fifth.stdout, fifth.stdout
    assert (run / "checkpoints.damaged" / "step_0000005" / first.name).is_file()
    assert _state(run)["step"] == 6

    # 64 bytes flipped in the middle of a tensor's data (the shard still reads back, as garbage): the file
    # fails its digest; eval and convert name it in one sentence, and the resume sets step 6 aside beside
    # the damaged step 5 (nothing deleted) and resumes from step 5, with a note naming the file and the step
    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
    from megatron_mtp.convert.to_hf import export_to_hf
    from megatron_mtp.errors import UserError

    step6 = run / "checkpoints" / "step_0000006"
    with TorchDistReader(step6) as reader:
        fh, offset, nbytes = reader.byte_range("decoder.layers.1.self_attention.linear_proj.weight")
        flipped = Path(fh.name)
    with open(flipped, "r+b") as out:
        out.seek(offset + nbytes // 2)
        data = out.read(64)
        out.seek(offset + nbytes // 2)
        out.write(bytes(b ^ 0xFF for b in data))
    failed = f"{flipped.name} does not match its SHA-256 digest in manifest.json (its bytes changed after the save)"
    direct = _eval(step6)
    assert direct.returncode == 2
    _one_sentence(direct.stderr, f"checkpoint {step6} is damaged: {failed}")
    with pytest.raises(UserError, match=f"'{step6}' is damaged: {flipped.name} does not match its SHA-256"):
        export_to_hf(step6, tmp_path / "hf")
    assert not (tmp_path / "hf").exists()
    sixth = train(run, steps=7, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=0"))
    assert f"step_0000006 is damaged ({failed}); it was moved to checkpoints.damaged/ and the run resumes from " \
           "step_0000005" in sixth.stdout and "at step 5" in sixth.stdout, sixth.stdout
    kept = run / "checkpoints.damaged" / "step_0000006" / flipped.name
    assert kept.read_bytes()[offset + nbytes // 2:][:64] == bytes(b ^ 0xFF for b in data)
    assert (run / "checkpoints.damaged" / "step_0000005" / first.name).is_file()
    assert _state(run)["step"] == 7


def _popen(run: Path, steps: int, small: list, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"), "--run-dir",
           str(run), "--max-steps", str(steps), *small, *extra]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT,
                            start_new_session=True)


def test_a_second_trainer_on_the_same_run_directory_refuses(tmp_path, train, small_overrides):
    run = tmp_path / "run"
    first = _popen(run, 40, small_overrides, "checkpoint.save_interval=5")
    try:
        deadline = time.time() + 300
        while time.time() < deadline and not ((run / "logs" / "metrics.jsonl").exists()
                                              and (run / "logs" / "metrics.jsonl").read_text().count("\n") >= 2):
            assert first.poll() is None, first.communicate()[1][-3000:]
            time.sleep(0.2)
        second = train(run, steps=40, check=False)
        assert second.returncode == 2
        _one_sentence(second.stderr, f"run directory {run} is in use by another trainer", f"pid {first.pid}")
        out, err = first.communicate(timeout=600)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
    assert first.returncode == 0, err[-3000:]
    steps = [json.loads(line)["step"] for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(1, 41))  # the second trainer wrote nothing into the first one's log
    assert _state(run)["step"] == 40


def test_a_stale_lock_from_a_dead_trainer_is_taken_over(tmp_path, train):
    run = tmp_path / "run"
    run.mkdir()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (run / ".trainer.lock").write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout),
                                                   "started": time.time(), "heartbeat": time.time()}))
    proc = train(run, steps=1)
    assert "took over the run lock of a trainer that is no longer running" in proc.stdout


def test_damaged_train_state_is_one_sentence(tmp_path, train):
    run = tmp_path / "run"
    train(run, steps=1)
    latest = (run / "checkpoints" / "latest").read_text().strip()
    (run / "checkpoints" / latest / "train_state.json").write_text("{not json")
    again = train(run, steps=2, check=False)
    assert again.returncode == 2
    _one_sentence(again.stderr, "train_state.json is not valid JSON; the checkpoint is damaged")
    evaluated = _eval(run)
    assert evaluated.returncode == 2
    _one_sentence(evaluated.stderr, "train_state.json is not valid JSON")


def _poison(step_dir: Path, key: str) -> None:
    """Overwrite the stored values of one tensor with NaN, in place, and drop the trainer's
    ``weights_finite`` record (which vouches for the weights it saved, and spares the export a scan):
    the checkpoint now reads like one saved before the record existed."""
    import torch

    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

    with TorchDistReader(step_dir) as reader:
        fh, offset, nbytes = reader.byte_range(key)
        dtype = reader.entry(key).dtype
    with open(fh.name, "r+b") as out:
        out.seek(offset)
        out.write(torch.full((nbytes // dtype.itemsize,), float("nan"), dtype=dtype).numpy().tobytes())
    state = json.loads((step_dir / "train_state.json").read_text())
    del state["weights_finite"]
    (step_dir / "train_state.json").write_text(json.dumps(state))
    from megatron_mtp.checkpoint.run_dir import write_manifest

    write_manifest(step_dir)  # as saved: the values are bad, not the bytes (the digests pin what is there now)


def test_non_finite_weights_are_refused_by_eval_convert_and_generate(tmp_path, train):
    from megatron_mtp.convert.drop_mtp import drop_mtp
    from megatron_mtp.convert.to_hf import export_to_hf
    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.generate import load_generator

    run = tmp_path / "run"
    train(run, steps=1)
    ok = _eval(run, "--json", "--steps", "1")
    json.loads(ok.stdout.strip().splitlines()[-1], parse_constant=lambda c: pytest.fail(f"bare {c} in JSON"))
    hf = export_to_hf(run, tmp_path / "hf", mtp="inline", dtype="fp32")
    step = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    key = "decoder.layers.1.self_attention.linear_proj.weight"
    _poison(step, key)
    bad = _eval(run)
    assert bad.returncode == 2
    _one_sentence(bad.stderr, "holds non-finite values (NaN or Inf)", "decoder.layers.1.self_attention.linear_proj")
    for call in (lambda: export_to_hf(run, tmp_path / "hf2", mtp="separate", dtype="fp32"),
                 lambda: export_to_hf(run, tmp_path / "hf3", mtp="none", dtype="bf16"),
                 lambda: drop_mtp(run, tmp_path / "dropped"),
                 lambda: load_generator(run)):
        with pytest.raises(UserError, match=f"non-finite values \\(NaN or Inf\\) in '{key}'"):
            call()
    assert not any((tmp_path / n).exists() for n in ("hf2", "hf3", "dropped"))  # nothing half-written left
    # an HF export whose tensor went bad is refused when decoding it
    import torch
    from safetensors.torch import load_file, save_file

    shard = sorted(hf.glob("*.safetensors"))[0]
    tensors = load_file(shard)
    name = next(n for n in tensors if n.endswith("o_proj.weight"))
    tensors[name] = torch.full_like(tensors[name], float("inf"))
    save_file(tensors, shard, metadata={"format": "pt"})
    with pytest.raises(UserError, match=f"non-finite values \\(NaN or Inf\\) in '{name}'"):
        load_generator(hf)


@functools.cache
def _why_no_mounts() -> str | None:
    """Why this process cannot mount a small filesystem (None when it can), tried once per session."""
    if os.geteuid() != 0:
        return "mounting a small filesystem needs root"
    with tempfile.TemporaryDirectory() as target:
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=65536", "tmpfs", target], capture_output=True,
                              text=True)
        if done.returncode != 0:
            return f"cannot mount here ({done.stderr.strip()})"
        subprocess.run(["umount", target], capture_output=True)
    return None


@pytest.fixture
def mounts():
    """Skip before any training when this process cannot mount (the cases below need root)."""
    if _why_no_mounts():
        pytest.skip(_why_no_mounts())


def _mount(kind: str, target: Path, *, size: int = 0, source: Path | None = None) -> None:
    """Mount a tmpfs of `size` bytes (kind=tmpfs) or a read-only bind of `source` (kind=ro) at `target`."""
    target.mkdir(parents=True, exist_ok=True)
    cmds = ([["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(target)]] if kind == "tmpfs" else
            [["mount", "--bind", str(source), str(target)], ["mount", "-o", "remount,bind,ro", str(target)]])
    for cmd in cmds:
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            subprocess.run(["umount", str(target)], capture_output=True)
            pytest.skip(f"cannot mount here ({done.stderr.strip()})")


@pytest.fixture(scope="module")
def checkpoint_bytes(tmp_path_factory, train) -> int:
    """The size of one checkpoint of the tests' model (the same for every case below)."""
    if _why_no_mounts():
        pytest.skip(_why_no_mounts())
    probe = tmp_path_factory.mktemp("probe") / "run"
    train(probe, steps=1)
    step = probe / "checkpoints" / (probe / "checkpoints" / "latest").read_text().strip()
    return sum(f.stat().st_size for f in step.rglob("*") if f.is_file())


def test_a_save_on_a_full_disk_fails_cleanly_and_the_next_run_resumes(tmp_path, train, checkpoint_bytes):
    size = checkpoint_bytes
    disk = tmp_path / "disk"
    _mount("tmpfs", disk, size=int(size * 1.6))  # room for one checkpoint, not for a second beside it
    try:
        run = disk / "run"
        full = train(run, steps=3, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=1"), check=False)
        assert full.returncode == 2
        _one_sentence(full.stderr, "not enough free space to save checkpoint step_0000002", "MiB are free",
                      "step_0000001 is still the latest checkpoint")
        assert not list((run / "checkpoints").glob("*.tmp"))
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(disk)], check=True)
        resumed = train(run, steps=3, overrides=("checkpoint.save_interval=1", "checkpoint.keep_last=1"))
        assert "at step 1" in resumed.stdout and _state(run)["step"] == 3
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


@pytest.mark.parametrize("async_save", ["true", "false"])
def test_a_write_that_runs_out_of_space_is_one_sentence_and_leaves_nothing(tmp_path, train, async_save,
                                                                            checkpoint_bytes):
    size = checkpoint_bytes
    disk = tmp_path / "disk"
    _mount("tmpfs", disk, size=size // 2)  # the first save runs out of space half-way
    try:
        run = disk / "run"
        proc = train(run, steps=2, overrides=("checkpoint.save_interval=1", f"checkpoint.async_save={async_save}"),
                     check=False)
        assert proc.returncode == 2
        _one_sentence(proc.stderr, "saving checkpoint step_0000001", "the filesystem is full (needs more than",
                      "MiB free)", "its partial files were removed")
        assert not list((run / "checkpoints").glob("*")), list((run / "checkpoints").iterdir())
        subprocess.run(["mount", "-o", f"remount,size={size * 4}", str(disk)], check=True)
        train(run, steps=2, overrides=("checkpoint.save_interval=1",))  # nothing to clean up first
        assert _state(run)["step"] == 2
    finally:
        subprocess.run(["umount", str(disk)], capture_output=True)


def test_a_file_size_limit_during_a_save_is_one_sentence_on_every_rank(tmp_path, small_overrides):
    """A real EFBIG: both ranks of a launch run under RLIMIT_FSIZE (1 MiB, below a shard of this model),
    with SIGXFSZ ignored as batch systems set it. The save ends in one sentence naming the limit and the
    files it stopped (not "the filesystem is full"), no rank prints a traceback, and nothing is left."""
    import resource

    from megatron_mtp.config import load_config
    from megatron_mtp.data.datasets import resolve_data

    resolve_data(load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), small_overrides))  # the corpus, unlimited

    def limited():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", "train", str(ROOT / "configs" / "tiny_cpu.yaml"),
                           "--run-dir", str(run), "--max-steps", "1", "--nproc-per-node", "2", *small_overrides,
                           "checkpoint.save_interval=1"], capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore"), preexec_fn=limited)
    assert proc.returncode == 2, proc.stderr[-3000:]
    _one_sentence(proc.stderr, "saving checkpoint step_0000001", "failed: a file-size limit (ulimit -f / RLIMIT_FSIZE, "
                  "1.0 MiB here, or the filesystem's maximum file size) stopped the write of __0_0.distcp",
                  "raise the limit (ulimit -f unlimited)", "its partial files were removed")
    assert "full" not in proc.stderr and "[rank1]" not in proc.stderr
    assert not list((run / "checkpoints").iterdir())


def test_a_read_only_checkpoint_directory_is_refused_before_training(tmp_path, train, mounts):
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    _mount("ro", run / "checkpoints", source=tmp_path / "elsewhere" if (tmp_path / "elsewhere").mkdir() is None
           else None)
    try:
        proc = train(run, steps=2, check=False)
        assert proc.returncode == 2
        _one_sentence(proc.stderr, "cannot be written (Read-only file system)")
        assert not (run / "logs" / "metrics.jsonl").exists()  # no step ran
    finally:
        subprocess.run(["umount", str(run / "checkpoints")], capture_output=True)
