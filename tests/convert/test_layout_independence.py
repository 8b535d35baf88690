"""Exports of the same weights saved at TP1 and at TP2 x PP2 x EP2 are byte-identical.

The TP2 x PP2 x EP2 run starts from the from-hf import of the TP1 export, so this also shows that
the trainer loads a converted checkpoint at another layout.
"""

from __future__ import annotations

import filecmp

import pytest

from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from tests.convert.conftest import TRAIN_OVERRIDES
from tests.convert.helpers import megatron_cli


@pytest.mark.dist
def test_tp2_pp2_ep2_checkpoint_exports_identical_bytes(trained_run, export_fp32, tmp_path):
    # Re-save the TP1 weights from 8 processes: one step with lr = 0 and a frozen expert bias leaves
    # every weight bit-identical, so any difference would come from the converter.
    imported = import_from_hf(export_fp32, tmp_path / "imported")
    run_dir = tmp_path / "p8"
    megatron_cli(
        "train", "configs/tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "1", "--nproc-per-node", "8",
        *TRAIN_OVERRIDES, "parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2",
        f"checkpoint.load={imported}", "checkpoint.load_optimizer=false", "optimizer.lr=0",
        "optimizer.min_lr=0", "model.router_bias_update_rate=0", "training.global_batch_size=4",
    )
    out = export_to_hf(run_dir, tmp_path / "hf", mtp="separate", dtype="fp32")
    for part in ("main", "mtp"):
        names = sorted(p.name for p in (out / part).iterdir())
        assert names == sorted(p.name for p in (export_fp32 / part).iterdir())
        for name in names:
            assert filecmp.cmp(out / part / name, export_fp32 / part / name, shallow=False), f"{part}/{name}"
