"""The gradient megatron-core computes is the gradient of lm + (λ/D)·Σ_d CE_d, for the λ in force; with the
chunked output loss (kernels.chunked_output_loss) too, whose losses and gradients equal the whole logits'."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_mtp.platform import megatron_core

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mcore
# 16 tokens × 3 sequences in chunks of 7: a chunk that divides neither
CHUNKED = ("kernels.chunked_output_loss=true", "kernels.output_loss_chunk=7")


def _objective(script, depth, *overrides):
    proc = script("objective_check.py", depth, ROOT / "configs" / "tiny_cpu.yaml", *overrides, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {"0.3", "0.1"}
    for lam, r in results.items():
        assert r["max_rel_err"] < 1e-5 and r["lm_rel_err"] < 1e-6, (lam, r)
    # λ changed between the two forwards and the objective followed it
    assert results["0.3"]["objective"] > results["0.1"]["objective"]
    return results


# data.eod_mask_loss: the check's random mask zeros stand for EODs, so depth k at position i must also
# drop its target when any of the mask at i .. i+k is zero (models/document_masks.py), not only at i+k
@pytest.mark.parametrize("depth, overrides", [(1, ()), (2, ()), (2, CHUNKED), (3, ("data.eod_mask_loss=true",))],
                         ids=["d1", "d2", "d2_chunked", "d3_documents"])
def test_gradient_equals_hand_computed_objective(depth, overrides, script):
    _objective(script, depth, *overrides)


@pytest.mark.skipif(not megatron_core.is_019(), reason="mtp.repeated_layer needs megatron-core 0.19")
def test_a_repeated_mtp_layer_takes_the_gradient_of_every_depth_into_one_module(script):
    """One module at depths 1 and 2: its gradient is the sum of both depths' terms of the objective."""
    shared = _objective(script, 2, "mtp.repeated_layer=true")["0.3"]
    one = _objective(script, 1)["0.3"]
    assert shared["trainable"] == one["trainable"]  # the second depth added no parameter


@pytest.fixture(scope="module")
def self_targets(script):
    """The frozen-base self-distillation objective at TP1 and TP2 (vocabulary split over the two ranks), and at
TP2 with the chunked output loss (sequence parallel: the hidden states are gathered before the chunks)."""
    found = {}
    for tp, extra in ((1, ()), (2, ()), ("2_chunked", CHUNKED)):
        nproc = int(str(tp)[0])
        proc = script("objective_check.py", 2, ROOT / "configs" / "tiny_cpu.yaml", "mtp.targets=self",
                      "mtp.freeze_base=true", "mtp.self_temperature=2", f"parallel.tensor={nproc}", *extra,
                      nproc=nproc, timeout=600)
        assert proc.returncode == 0, proc.stderr[-4000:]
        found[tp] = json.loads(proc.stdout.strip().splitlines()[-1])
    return found


@pytest.mark.parametrize("tp", [1, 2, "2_chunked"])
def test_self_targets_gradient_equals_cross_entropy_to_detached_main_distribution(self_targets, tp):
    for lam, r in self_targets[tp].items():
        assert r["max_rel_err"] < 1e-5 and r["lm_rel_err"] < 1e-6, (tp, lam, r)
    # frozen base: only the MTP modules take a gradient, and the objective is the MTP terms alone
    assert self_targets[tp]["0.3"]["objective"] == pytest.approx(3 * self_targets[tp]["0.1"]["objective"], rel=1e-6)


@pytest.mark.parametrize("tp", [2, "2_chunked"])
def test_self_targets_at_tp2_equal_tp1(self_targets, tp):
    for lam in ("0.3", "0.1"):
        assert self_targets[tp][lam]["objective"] == pytest.approx(self_targets[1][lam]["objective"], rel=1e-6)
        assert self_targets[tp][lam]["trainable"] < self_targets[1][lam]["trainable"]  # each TP rank holds a slice


@pytest.mark.parametrize("overrides", [(), CHUNKED], ids=["whole", "chunked"])
def test_mix_targets_gradient(script, overrides):
    proc = script("objective_check.py", 1, ROOT / "configs" / "tiny_cpu.yaml", "mtp.targets=mix",
                  "mtp.self_weight=0.25", *overrides, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    for lam, r in json.loads(proc.stdout.strip().splitlines()[-1]).items():
        assert r["max_rel_err"] < 1e-5 and r["lm_rel_err"] < 1e-6, (lam, r)
