"""Activation recomputation changes memory, never the math: same losses and gradients as without it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recompute_settings import RECOMPUTE

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]

# module type -> forward calls added by recomputing it once per layer that has it (3 decoder layers,
# of which 2 MoE, plus 2 MTP layers: a count that includes the MTP layers shows they follow too)
EXPECTED_EXTRA = {
    "mla_up_proj": ("ColumnParallelLinear", 10),
    "core_attn": ("CoreAttention", 5),
    "layernorm": ("RMSNorm", 10),
    "mlp": ("MLP", 1),
    "moe": ("TopKRouter", 4),
    "shared_experts": ("SharedExpertMLP", 4),
    "full_uniform": ("TransformerLayer", 5),
    "full_block": ("TransformerLayer", 2),  # block recompute leaves MTP layers as they are
}


def test_every_recompute_setting_keeps_loss_and_gradients(script):
    proc = script("recompute_check.py", ROOT / "configs" / "tiny_cpu.yaml", json.dumps(RECOMPUTE), timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert list(results) == list(RECOMPUTE)
    for name, r in results.items():
        assert r["max_rel_grad_diff"] < 1e-6 and r["loss_diff"] < 1e-6, (name, r)
        if name in EXPECTED_EXTRA:
            module, calls = EXPECTED_EXTRA[name]
            assert r["extra_calls"].get(module) == calls, (name, r["extra_calls"])
    assert results["none"]["extra_calls"] == {}
    assert set(results["all_selective"]["extra_calls"]) >= {"ColumnParallelLinear", "CoreAttention", "RMSNorm",
                                                            "TopKRouter", "SharedExpertMLP"}


# ~3 minutes on 2 cores: the one-process check above compares every setting exactly; this one adds
# the recomputed layers' communication under TP, PP and EP (run with -m slow)
@pytest.mark.slow
def test_recompute_matches_at_tp2_pp2_ep2(tmp_path, train, metrics):
    seed = tmp_path / "seed"
    train(seed, steps=1)
    layout = ("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2",
              f"checkpoint.load={seed}", "checkpoint.load_optimizer=false")
    runs = {}
    for name, extra in (("none", ()),
                        ("selective", ("recompute.granularity=selective",
                                       "recompute.modules=[mla_up_proj,core_attn,layernorm,mlp,moe,shared_experts]")),
                        ("full", ("recompute.granularity=full", "recompute.num_layers=1"))):
        train(tmp_path / name, nproc=8, steps=2, overrides=(*layout, *extra))
        runs[name] = metrics(tmp_path / name)
    for name in ("selective", "full"):
        for a, b in zip(runs["none"], runs[name]):
            for key in ("train/lm_loss", "train/mtp_loss_1", "train/grad_norm"):
                assert abs(a[key] - b[key]) <= 1e-6 * max(1.0, abs(a[key])), (name, a["step"], key, a[key], b[key])
