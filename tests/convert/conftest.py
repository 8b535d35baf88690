"""Fixtures: one tiny model trained by the real trainer, its megatron-core logits, its HF export."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.convert.helpers import megatron_cli, run

FORWARD_LOGITS = Path(__file__).resolve().parents[1] / "dist" / "scripts" / "forward_logits.py"

# Group routing with topk/group_topk = 2 is what the HF DeepSeek format can express (see hf_config.py).
TRAIN_OVERRIDES = [
    "model.router_group_topk=1", "training.seq_length=32", "training.micro_batch_size=2",
    "training.global_batch_size=2", "logging.eval_interval=0", "logging.tensorboard=false",
    "checkpoint.save_interval=0",
]


@pytest.fixture(scope="session")
def trained_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("convert_run") / "run"
    megatron_cli("train", "configs/tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "2", *TRAIN_OVERRIDES)
    return run_dir


@pytest.fixture(scope="session")
def tokens(tmp_path_factory):
    g = torch.Generator().manual_seed(3)
    path = tmp_path_factory.mktemp("tokens") / "tokens.pt"
    torch.save(torch.randint(0, 4000, (2, 12), generator=g), path)
    return path


def megatron_forward(ckpt, tokens_path, out_path, *overrides) -> dict:
    """Logits of megatron-core's own forward (tests/dist/scripts/forward_logits.py) on a warm rank."""
    run([str(FORWARD_LOGITS), str(ckpt), str(tokens_path), str(out_path), *overrides])
    return torch.load(out_path)


@pytest.fixture(scope="session")
def megatron_logits(trained_run, tokens, tmp_path_factory):
    return megatron_forward(trained_run, tokens, tmp_path_factory.mktemp("logits") / "out.pt")


@pytest.fixture(scope="session")
def export_fp32(trained_run, tmp_path_factory):
    from megatron_mtp.convert.to_hf import export_to_hf

    out = tmp_path_factory.mktemp("export") / "fp32"
    export_to_hf(trained_run, out, mtp="separate", dtype="fp32")
    return out
