"""The gradient megatron-core computes is the gradient of lm + (λ/D)·Σ_d CE_d, for the λ in force."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("depth", [1, 2])
def test_gradient_equals_hand_computed_objective(depth, script):
    proc = script("objective_check.py", depth, ROOT / "configs" / "tiny_cpu.yaml", timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(results) == {"0.3", "0.1"}
    for lam, r in results.items():
        assert r["max_rel_err"] < 1e-5, (lam, r)
    # λ changed between the two forwards and the objective followed it
    assert results["0.3"]["objective"] > results["0.1"]["objective"]
