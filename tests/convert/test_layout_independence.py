"""Exports of the same weights saved at TP1 and at other layouts are byte-identical.

The multi-process run starts from the from-hf import of the TP1 export, so this also shows that
the trainer loads a converted checkpoint at another layout (TP2 x PP2 x EP2, and the interleaved
schedule's PP2 x VPP2 with MTP in the last chunk).
"""

from __future__ import annotations

import filecmp

import pytest

from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from tests.convert.conftest import TRAIN_OVERRIDES
from tests.convert.helpers import launched_cli, megatron_cli

LAYOUTS = {
    "tp2_pp2_ep2": (8, ("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2")),
    "pp2_vpp2": (2, ("parallel.pipeline=2", "parallel.virtual_pipeline=2")),
}


@pytest.mark.dist
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_checkpoint_saved_at_another_layout_exports_identical_bytes(trained_run, export_fp32, tmp_path, layout):
    # Re-save the TP1 weights from several processes: one step with lr = 0 and a frozen expert bias
    # leaves every weight bit-identical, so any difference would come from the converter.
    nproc, parallel = LAYOUTS[layout]
    imported = import_from_hf(export_fp32, tmp_path / "imported")
    run_dir = tmp_path / layout
    args = ("train", "configs/tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "1", *TRAIN_OVERRIDES,
            *parallel, f"checkpoint.load={imported}", "checkpoint.load_optimizer=false", "optimizer.lr=0",
            "optimizer.min_lr=0", "model.router_bias_update_rate=0", "training.global_batch_size=4")
    if layout == "pp2_vpp2":  # through the local launcher, as a user runs it: it starts its own ranks
        launched_cli(*args, "--nproc-per-node", str(nproc))
    else:
        megatron_cli(*args, nproc=nproc)
    out = export_to_hf(run_dir, tmp_path / "hf", mtp="separate", dtype="fp32")
    for part in ("main", "mtp"):
        names = sorted(p.name for p in (out / part).iterdir())
        assert names == sorted(p.name for p in (export_fp32 / part).iterdir())
        for name in names:
            assert filecmp.cmp(out / part / name, export_fp32 / part / name, shallow=False), f"{part}/{name}"
