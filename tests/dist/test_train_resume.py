"""Resuming from a checkpoint continues exactly where the uninterrupted run would be."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.dist.conftest import run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

COMMON = ("schedule.decay_style=cosine", "schedule.decay_steps=6", "schedule.warmup_steps=2")


# one process with the output layer's loss in chunks (kernels.chunked_output_loss) and a batch-size ramp-up
# that the resume lands in the middle of (global batches 2, 2, 4, 6, 8, 8; the λ switch at 640 tokens
# comes where the consumed tokens reach it), EP2×DP2 with the whole logits
RAMP = ("training.rampup_batch_size=[2,2,12]", "mtp.loss_weight_schedule=[[0,0.3],[640,0.1]]",
        "logging.wandb_project=mtp-test", "logging.wandb_mode=offline")


@pytest.mark.parametrize("nproc,layout", [(1, ("kernels.chunked_output_loss=true", "kernels.output_loss_chunk=100",
                                               *RAMP)),
                                          (2, ("parallel.expert=2",))], ids=["single_chunked_rampup", "ep2_dp2"])
def test_resume_equals_uninterrupted(tmp_path, nproc, layout, train, metrics):
    straight = tmp_path / "straight"
    train(straight, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    resumed = tmp_path / "resumed"
    train(resumed, nproc=nproc, steps=3, overrides=(*COMMON, *layout))
    second = train(resumed, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    assert "resumed from" in second.stdout and "at step 3" in second.stdout
    a, b = metrics(straight), metrics(resumed)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5, 6]
    for x, y in zip(a, b):
        for key in ("train/lm_loss", "train/mtp_loss_1", "train/lr", "train/grad_norm"):
            assert abs(x[key] - y[key]) <= 1e-6 * max(1.0, abs(x[key])), (x["step"], key, x[key], y[key])
    if RAMP[0] in layout:  # samples consumed before each step: 0, 2, 4, 8, 14, 22 (64 tokens each)
        assert [r["train/global_batch_size"] for r in b] == [2, 2, 4, 6, 8, 8]
        assert [r["train/mtp_lambda"] for r in b] == [0.3, 0.3, 0.3, 0.3, 0.1, 0.1]
        # W&B (offline): both attempts logged into one W&B run, the same scalars as metrics.jsonl
        run_id = (resumed / "logs" / "wandb_run_id").read_text().strip()
        files = sorted((resumed / "wandb").glob("offline-run-*/run-*.wandb"))
        assert [f.name for f in files] == [f"run-{run_id}.wandb"] * 2
        rows = [row for f in files for row in wandb_history(f)]
        assert [row["_step"] for row in rows] == [1, 2, 3, 4, 5, 6]
        for logged, row in zip(b, rows):
            for key in ("train/lm_loss", "perf/tflops_per_gpu", "train/grad_norm_max", "time/forward_backward_s",
                        "moe/imbalance/layer_02", "train/global_batch_size"):
                assert row[key] == pytest.approx(logged[key], rel=1e-12), (key, row[key], logged[key])
    # a finished run does nothing more
    again = train(resumed, nproc=nproc, steps=6, overrides=(*COMMON, *layout))
    assert "already finished" in again.stdout
    assert len(metrics(resumed)) == 6


def test_optimizer_cannot_move_between_ep1_and_ep2(tmp_path, train):
    run = tmp_path / "run"
    train(run, nproc=2, steps=1, overrides=("parallel.expert=2",))
    proc = train(run, nproc=2, steps=2, overrides=("parallel.expert=1",), check=False)
    assert proc.returncode != 0
    assert "expert parallel size 2 and cannot be resharded to 1" in proc.stderr
    assert "checkpoint.load_optimizer=false" in proc.stderr
    # the same refusal for a new run's checkpoint.load comes after the run directory is claimed (the
    # optimizer is built by then): the failed start leaves no lock, no checkpoints/, no directory
    failed = tmp_path / "failed"
    proc = train(failed, nproc=2, steps=1, overrides=(f"checkpoint.load={run}", "parallel.expert=1"), check=False)
    assert proc.returncode != 0 and "cannot be resharded to 1" in proc.stderr, proc.stderr[-2000:]
    assert not failed.exists(), sorted(p.name for p in failed.rglob("*"))
    # weights-only start from it at EP1 works
    fresh = tmp_path / "fresh"
    train(fresh, nproc=2, steps=1, overrides=(f"checkpoint.load={run}", "checkpoint.load_optimizer=false"))


@pytest.fixture(scope="module")
def straight_5(tmp_path_factory, train):
    """One process for 5 steps, its step 3 kept in the reshardable optimizer format."""
    run = tmp_path_factory.mktemp("resharded") / "straight"
    train(run, steps=5, overrides=(*COMMON, "checkpoint.save_interval=3", "checkpoint.keep_last=2",
                                   "checkpoint.optimizer_format=reshardable"))
    return run


@pytest.mark.parametrize("layout", [("parallel.tensor=2",), ("parallel.pipeline=2",)], ids=["tp2", "pp2"])
def test_resume_at_another_layout_reshards_optimizer(straight_5, tmp_path, train, metrics, layout):
    """1 process for 3 steps saved in the reshardable optimizer format, then 2 processes at another
    layout: optimizer state is resharded and the run continues like the uninterrupted one (within the
    numerics of the layout change)."""
    straight = straight_5
    moved = run_as_of(straight, tmp_path / "moved", 3)
    # as a checkpoint from before the format was recorded: it loads in the reshardable format it was written in
    import json

    state_file = moved / "checkpoints" / "step_0000003" / "train_state.json"
    state = json.loads(state_file.read_text())
    del state["optimizer_format"], state["optimizer_layout"]
    state_file.write_text(json.dumps(state))
    second = train(moved, nproc=2, steps=5, overrides=(*COMMON, *layout))
    assert "at step 3" in second.stdout
    a, b = metrics(straight), metrics(moved)
    assert [r["step"] for r in b] == [1, 2, 3, 4, 5]
    for x, y in zip(a[3:], b[3:]):
        for key in ("train/lm_loss", "train/mtp_loss_1"):
            assert abs(x[key] - y[key]) < 2e-3, (x["step"], key, x[key], y[key])


@pytest.fixture(scope="module")
def one_step_run(tmp_path_factory, train):
    """A run of one step; every refused resume below must leave it exactly as it is."""
    run = tmp_path_factory.mktemp("meaning") / "run"
    train(run, steps=1, overrides=("checkpoint.keep_last=1",))
    return run


def _checkpoint_files(run) -> dict:
    root = run / "checkpoints"
    return {str(p.relative_to(root)): p.stat().st_mtime_ns for p in root.rglob("*")}


@pytest.mark.parametrize("change, fields", [
    (("data.default_corpus_vocab_size=512",),  # another tokenizer: the same ids would mean other text
     ("model.vocab_size is 1024 in the checkpoint and 512 now",
      "data.default_corpus_vocab_size is 1024 in the checkpoint and 512 now")),
    (("model.num_layers=3", "mtp.num_layers=2", "model.hidden_size=64"),
     ("model.num_layers is 2 in the checkpoint and 3 now", "model.hidden_size is 128 in the checkpoint and 64 now",
      "mtp.num_layers is 1 in the checkpoint and 2 now")),
    (("mtp.style=parallel",), ("mtp.style is 'sequential' in the checkpoint and 'parallel' now",)),
], ids=["tokenizer", "shape_and_mtp_depth", "mtp_style"])
def test_a_resume_that_changes_what_the_checkpoint_means_is_refused(one_step_run, train, metrics, change, fields):
    run = one_step_run
    before, rows = _checkpoint_files(run), len(metrics(run))
    proc = train(run, steps=3, overrides=("checkpoint.keep_last=1", *change), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for field in fields:
        assert field in errors[0], errors[0]
    assert "--run-dir" in errors[0] and "checkpoint.load_optimizer=false" in errors[0]
    assert _checkpoint_files(run) == before and len(metrics(run)) == rows  # nothing trained, nothing deleted


def test_a_resume_takes_the_new_schedule_layout_and_intervals(tmp_path, train, metrics):
    """The config's schedule wins on resume: a new lr, minimum and decay style, and a longer
    training.max_steps that stretches the decay; the logged lr after the resume is the new schedule's
    formula at each step (the checkpoint's schedule would hold its minimum, 3e-4)."""
    run = tmp_path / "run"
    train(run, steps=2, overrides=("optimizer.lr=3e-3", "optimizer.min_lr=3e-4", "schedule.decay_style=cosine",
                                   "checkpoint.optimizer_format=reshardable"))
    assert abs(metrics(run)[-1]["train/lr"] - 3e-4) < 1e-9  # the first run decayed to its minimum
    proc = train(run, nproc=2, steps=5, overrides=("parallel.tensor=2", "optimizer.lr=1e-3", "optimizer.min_lr=1e-5",
                                                   "schedule.decay_style=linear", "optimizer.adam_beta2=0.9",
                                                   "logging.log_interval=1", "model.aux_loss_coeff=1e-3"))
    assert "at step 2" in proc.stdout
    note = next(line for line in proc.stdout.splitlines() if "the schedule differs" in line)
    for change in ("optimizer.lr 0.003 -> 0.001", "optimizer.min_lr 0.0003 -> 1e-05", "schedule.decay_style cosine "
                   "-> linear", "optimizer.adam_beta2 0.95 -> 0.9", "training.max_steps 2 -> 5", "from step 3"):
        assert change in note, note
    rows = metrics(run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    for row in rows[2:]:  # linear decay over the new max_steps, no warm-up
        expected = 1e-3 - (1e-3 - 1e-5) * row["step"] / 5
        assert abs(row["train/lr"] - expected) < 1e-9, (row["step"], row["train/lr"], expected)
    # the logged model TFLOP/s per GPU is plan's FLOPs per token × the measured tokens/s over the 2 ranks
    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.plan import report
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import parse_gpu

    planned = report.build(make_plan(read_config(run / "checkpoints" / "step_0000005"), 2, parse_gpu("h100"), cpu=True))
    per_token = planned["training_flops_per_step"] / planned["tokens_per_step"]
    clip = 1.0  # optimizer.clip_grad
    for row in rows[2:]:
        want = per_token * row["perf/tokens_per_s"] / 2 / 1e12
        assert abs(row["perf/tflops_per_gpu"] - want) <= 1e-9 * want, (row["perf/tflops_per_gpu"], want)
        assert row["perf/tokens_per_s_per_gpu"] == row["perf/tokens_per_s"] / 2 and "perf/mfu" not in row  # CPU
        # one step per interval: its norm is the interval's mean and max; clipped when above optimizer.clip_grad
        assert row["train/grad_norm_max"] == row["train/grad_norm"]
        assert row["train/clipped_steps"] == float(row["train/grad_norm"] > clip)


def test_a_resume_on_data_of_another_tokenizer_of_the_same_size_is_refused(one_step_run, train, metrics, tmp_path):
    """Two tokenizers of one vocabulary pass every shape check; the fingerprint tells them apart."""
    import json
    import subprocess
    import sys

    run = one_step_run
    latest = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    other = tmp_path / "other_tokenizer"
    other.mkdir()
    for f in (latest / "tokenizer").iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    spec = json.loads((other / "tokenizer.json").read_text())
    vocab = spec["model"]["vocab"]
    a, b = "def", "class"  # the same tokens under swapped ids: the same size, other meanings
    vocab[a], vocab[b] = vocab[b], vocab[a]
    (other / "tokenizer.json").write_text(json.dumps(spec))
    corpus = tmp_path / "b.jsonl"
    corpus.write_text("".join(json.dumps({"text": f"def f{i}(x):\n    return x * {i}\n" * 20}) + "\n"
                              for i in range(200)))
    prefix = tmp_path / "b"
    subprocess.run([sys.executable, "-m", "megatron_mtp", "preprocess", "--input", str(corpus), "--tokenizer",
                    str(other), "--output-prefix", str(prefix)], check=True, capture_output=True, timeout=120)
    before, rows = _checkpoint_files(run), len(metrics(run))
    proc = train(run, steps=3, overrides=("checkpoint.keep_last=1", f"data.paths=[{prefix}]"), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "is not the one the checkpoint was trained with" in errors[0] and "fingerprint" in errors[0], errors[0]
    assert _checkpoint_files(run) == before and len(metrics(run)) == rows


def test_a_parallel_format_optimizer_state_refuses_another_model_parallel_layout(one_step_run, train, metrics):
    """The default optimizer format reshards over data-parallel ranks only: TP2 is one sentence naming the
    way out, before any process group starts; DP2 (EP2 keeps the expert split) resumes."""
    run = one_step_run
    before, rows = _checkpoint_files(run), len(metrics(run))
    proc = train(run, nproc=2, steps=3, overrides=("checkpoint.keep_last=1", "parallel.tensor=2"), check=False)
    assert proc.returncode == 2, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if "error:" in line]
    assert errors and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for words in ("is in the parallel format (checkpoint.optimizer_format=parallel)", "written at TP1 × PP1",
                  "not TP2 × PP1", "checkpoint.optimizer_format=reshardable until its next save",
                  "checkpoint.load_optimizer=false"):
        assert words in errors[0], errors[0]
    assert _checkpoint_files(run) == before and len(metrics(run)) == rows
    # another data-parallel size is what the format reshards: one process's checkpoint resumes on two
    resumed = train(run, nproc=2, steps=2, overrides=("checkpoint.keep_last=1",))
    assert "at step 1" in resumed.stdout and [r["step"] for r in metrics(run)] == [1, 2]


def wandb_history(path: Path) -> list[dict]:
    """The history rows of an offline W&B run file: LevelDB-log records (7-byte headers in 32 KiB blocks)
    of wandb's protobuf Records, after the file's 7-byte ':W&B' header."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert data[:4] == b":W&B", data[:8]
    block, pos, records, pending = 32768, 7, [], b""
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # a block's tail too short for a header is padding
            pos += block - pos % block
            continue
        length, kind = int.from_bytes(data[pos + 4:pos + 6], "little"), data[pos + 6]
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # FULL, LAST
            records.append(pending + chunk)
            pending = b""
        elif kind in (2, 3):  # FIRST, MIDDLE
            pending += chunk
    rows = []
    for raw in records:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(raw)
        if record.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows
