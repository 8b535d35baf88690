"""The chunked output-layer loss over a vocabulary split between two tensor-parallel ranks (megatron-core's
groups and region ops, with and without sequence parallelism) equals the whole logits' loss: losses to
1e-6, gradients of the hidden state and the weight slice to 1e-5, and the argmaxes of the acceptance metric
identical (one process: tests/unit)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.mcore


@pytest.mark.parametrize("mode", ["tp", "sp"])
def test_tp2_equals_the_whole_vocabulary(script, mode):
    proc = script("chunked_loss_check.py", ROOT / "configs" / "tiny_cpu.yaml", mode, nproc=2, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["tp"] == 2
    for target, err in result["errors"].items():
        assert err["loss"] < 1e-6 and err["grad_hidden"] < 1e-5 and err["grad_weight"] < 1e-5, (target, err)
    assert result["argmax_equal"] == {"tokens": True, "self": True, "mix": True}
