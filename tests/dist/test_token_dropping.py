"""Token dropping (model.moe_capacity_factor): expert parallelism drops the tokens one process drops, and
a resume may change the capacity.

A capacity applies per router call to the tokens of one micro-batch on one rank, so layouts that keep
a micro-batch's tokens together (data and expert parallelism) make the same drops as one process;
sequence parallelism (TP with MoE) splits them and drops among fewer tokens (README: "Configs")."""

from __future__ import annotations

import pytest
from scalars import compare_scalars, values

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

CAPACITY = ("model.moe_capacity_factor=1.0",)
TOLERANCE = {"train/grad_norm": 1e-2, "train/grad_norm_max": 1e-2, "train/mtp_acceptance_1": 1e-2,
             "train/mtp_accuracy_1": 1e-2, "moe/max_violation": 2e-2}


def test_expert_parallel_drops_as_one_process_and_a_resume_may_change_the_capacity(tmp_path, train, metrics):
    single, ep2 = tmp_path / "single", tmp_path / "ep2"
    train(single, steps=2, overrides=CAPACITY)
    train(ep2, nproc=2, steps=2, overrides=(*CAPACITY, "parallel.expert=2"))
    want, got = metrics(single), metrics(ep2)
    keys = compare_scalars(got, want, "ep2 with a capacity", TOLERANCE)
    assert "moe/dropped_tokens" in keys and any(k.startswith("moe/dropped/layer_") for k in keys)
    assert all(v > 0 for v in values(want, "moe/dropped_tokens"))
    # the capacity is no part of what the checkpoint means: a resume takes a larger one, which drops less
    proc = train(ep2, nproc=2, steps=3, overrides=("model.moe_capacity_factor=4.0", "parallel.expert=2"))
    assert "resumed from" in proc.stdout
    rows = metrics(ep2)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["moe/dropped_tokens"] < min(values(want, "moe/dropped_tokens"))
