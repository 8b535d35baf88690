"""`megatron-mtp eval`: JSON shape, and --text-file against an independent computation from logits."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.workers.pool import POOL

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
SEQ = 64


def _eval(*args) -> subprocess.CompletedProcess:
    return POOL.run(["-m", "megatron_mtp", "eval", *map(str, args)], timeout=600, cwd=ROOT)


@pytest.fixture(scope="module")
def run(tmp_path_factory, train):
    run_dir = tmp_path_factory.mktemp("eval") / "run"
    train(run_dir, steps=2, overrides=("logging.tensorboard=true",))
    return run_dir


def test_tensorboard_event_files_hold_the_scalars(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(run / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    for tag in ("train/lm_loss", "train/mtp_loss_1", "train/mtp_acceptance_1", "train/mtp_lambda", "train/lr",
                "train/grad_norm", "perf/tokens_per_s", "perf/memory_gib", "moe/max_violation", "moe/balance_loss"):
        assert tag in tags, tag
    assert [e.step for e in events.Scalars("train/lm_loss")] == [1, 2]
    assert events.Scalars("train/mtp_lambda")[0].value == pytest.approx(0.3)


def test_eval_json_on_validation_split(run):
    proc = _eval(run, "--json", "--steps", "2")
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert isinstance(result["lm_loss"], float) and 0 < result["lm_loss"] < 20
    assert len(result["mtp_loss"]) == len(result["mtp_acceptance"]) == 1
    assert 0.0 <= result["mtp_acceptance"][0] <= 1.0
    assert result["tokens"] == 2 * 2 * SEQ  # 2 batches of micro_batch_size 2, every position scored
    # tiny_cpu's data.paths is null: the split is the embedded default corpus's, and is called that
    assert result["data"].startswith("the validation split of the embedded default corpus (data.paths is null): "
                                     "2 batches"), result["data"]


def test_eval_text_file_matches_logits(run, tmp_path, probe_logits):
    from tokenizers import Tokenizer

    text = (ROOT / "megatron_mtp" / "training" / "trainer.py").read_text()
    text_file = tmp_path / "held_out.py"
    text_file.write_text(text)
    proc = _eval(run, "--json", "--text-file", text_file)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])

    ckpt = run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()
    ids = Tokenizer.from_file(str(ckpt / "tokenizer" / "tokenizer.json")).encode(text, add_special_tokens=False).ids
    n = len(ids) // SEQ
    windows = torch.tensor(ids[: n * SEQ]).view(n, SEQ)
    torch.save(windows, tmp_path / "windows.pt")
    out = probe_logits(run, tmp_path / "windows.pt", tmp_path / "logits.pt")
    main, mtp = out["logits"].double(), out["mtp_logits"][0].double()
    lm = F.cross_entropy(main[:, :-1].reshape(-1, main.shape[-1]), windows[:, 1:].reshape(-1))
    # MTP depth 1 at t predicts token t+2, inside the window
    mtp_ce = F.cross_entropy(mtp[:, :-2].reshape(-1, mtp.shape[-1]), windows[:, 2:].reshape(-1))
    accept = (mtp[:, :-2].argmax(-1) == main[:, 1:-1].argmax(-1)).double().mean()
    assert got["tokens"] == n * (SEQ - 1)
    assert abs(got["lm_loss"] - float(lm)) < 1e-4
    assert abs(got["mtp_loss"][0] - float(mtp_ce)) < 1e-4
    assert abs(got["mtp_acceptance"][0] - float(accept)) < 1e-6


def test_eval_bad_inputs(run, tmp_path):
    missing = _eval(tmp_path / "nothing")
    assert missing.returncode == 2
    assert "does not exist" in missing.stderr and "Traceback" not in missing.stderr
    empty = _eval(tmp_path)
    assert empty.returncode == 2
    assert "holds no checkpoint" in empty.stderr and "Traceback" not in empty.stderr
    short = tmp_path / "short.txt"
    short.write_text("x = 1\n")
    too_short = _eval(run, "--text-file", short)
    assert too_short.returncode == 2
    assert "fewer than one window" in too_short.stderr


def test_damaged_checkpoint_is_one_clear_error(run, tmp_path):
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run / "checkpoints", copy / "checkpoints")
    step = copy / "checkpoints" / (copy / "checkpoints" / "latest").read_text().strip()
    shard = sorted(step.glob("*.distcp"))[0]
    size = shard.stat().st_size
    with open(shard, "r+b") as fh:
        fh.truncate(1000)
    truncated = _eval(copy)  # the run's only checkpoint: nothing to fall back to
    assert truncated.returncode == 2 and "Traceback" not in truncated.stderr
    assert f"names '{step.name}', which is incomplete ({shard.name} truncated (1000 of {size} bytes)), and no " \
           "other complete checkpoint" in truncated.stderr, truncated.stderr[-3000:]
    direct = _eval(step)
    assert direct.returncode == 2 and "Traceback" not in direct.stderr and len(direct.stderr.strip().splitlines()) == 1
    assert f"checkpoint {step} is incomplete ({shard.name} truncated (1000 of {size} bytes))" in direct.stderr
    shard.unlink()
    missing = _eval(step)
    assert missing.returncode == 2 and f"({shard.name} missing)" in missing.stderr and "Traceback" not in missing.stderr
