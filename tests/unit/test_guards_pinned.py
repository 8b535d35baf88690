"""Behaviours of the step guard, the checkpoint publisher and the resume rules that a process-level test
cannot pin (a kill almost never lands between two renames; a fault injection bypasses the loss check)."""

from __future__ import annotations

import math
import os
from pathlib import Path

import pytest
import torch

from megatron_mtp.checkpoint import run_dir
from megatron_mtp.checkpoint.resume_rules import meaning_changes
from megatron_mtp.config import load_config
from megatron_mtp.training.step_guard import losses_finite

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml")


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_a_non_finite_loss_alone_is_reported_non_finite(bad):
    """The LM loss of one micro-batch, or one MTP depth's loss, non-finite while everything else (and
    the gradients) is finite: the step guard must see it."""
    good = [{"lm_sum": torch.tensor(3.0)}, {"lm_sum": torch.tensor(2.5)}]
    assert losses_finite(good, torch.tensor([2.0, 2.1]))
    assert losses_finite(good, None)
    assert not losses_finite([good[0], {"lm_sum": torch.tensor(bad)}], torch.tensor([2.0, 2.1]))
    assert not losses_finite(good, torch.tensor([2.0, bad]))


def test_latest_is_written_only_after_the_step_has_its_name(tmp_path, monkeypatch):
    root = tmp_path / "checkpoints"
    root.mkdir()
    tmp, final = root / "step_0000002.123.tmp", root / "step_0000002"
    tmp.mkdir()
    (tmp / "manifest.json").write_text("{}")
    seen = []
    real_replace = os.replace

    def replace(src, dst):
        if os.path.basename(dst) == run_dir.LATEST:  # when latest moves, the step must be complete by name
            seen.append((final.is_dir(), tmp.exists()))
        real_replace(src, dst)

    monkeypatch.setattr(run_dir.os, "replace", replace)
    run_dir.publish_step(tmp, final)
    assert seen == [(True, False)]
    assert (root / run_dir.LATEST).read_text().strip() == final.name
    # a step saved again replaces the old one whole
    tmp.mkdir()
    (tmp / "new").write_text("")
    run_dir.publish_step(tmp, final)
    assert sorted(p.name for p in final.iterdir()) == ["new"] and seen[-1] == (True, False)


ROUTING = [  # every routing field a resume must refuse to change, named here so that dropping one fails
    ("model.router_topk", 3), ("model.router_num_groups", 4), ("model.router_group_topk", 2),
    ("model.router_score_function", "softmax"), ("model.router_topk_scaling_factor", 1.5),
    ("model.router_norm_topk_prob", False), ("model.router_enable_expert_bias", False),
    ("model.num_experts", 16), ("model.first_k_dense", 2), ("model.num_shared_experts", 2),
]


@pytest.mark.parametrize("field,value", ROUTING, ids=[r[0] for r in ROUTING])
def test_a_resume_refuses_a_change_of_the_routing(field, value):
    saved = load_config(TINY)
    now = load_config(TINY, [f"{field}={value}"])
    changes = meaning_changes(saved, now)
    assert len(changes) == 1 and changes[0].startswith(f"{field} is "), changes


def test_pruning_renames_at_once_and_removes_in_the_background(tmp_path, monkeypatch):
    """No rank waits on an rmtree at the publishing barrier: the old steps leave the resumable names at
    once, and their removal runs beside training (here held back until released)."""
    import threading

    from megatron_mtp.training import checkpoint_saver

    root = tmp_path / "checkpoints"
    for step in (1, 2, 3):
        d = root / run_dir.step_dir_name(step)
        d.mkdir(parents=True)
        (d / "manifest.json").write_text('{"files": {}}')
        for name in run_dir.REQUIRED_FILES:
            (d / name).write_text("x")
    (root / "step_0000000.deleting").mkdir()  # left by a killed run
    release = threading.Event()
    real_rmtree = checkpoint_saver.shutil.rmtree

    def slow_rmtree(path, ignore_errors=False):
        release.wait(10)
        real_rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(checkpoint_saver.shutil, "rmtree", slow_rmtree)
    saver = object.__new__(checkpoint_saver.CheckpointSaver)
    saver.root, saver.keep_last, saver.deleters, saver.queue = root, 1, [], None
    saver._prune(keep=run_dir.step_dir_name(3))  # returns while the removal is held back
    assert [p.name for p in run_dir.complete_steps(root)] == ["step_0000003"]
    assert sorted(p.name for p in root.glob("*.deleting")) == ["step_0000000.deleting", "step_0000001.deleting",
                                                               "step_0000002.deleting"]
    release.set()
    saver.close()
    assert sorted(p.name for p in root.iterdir()) == ["step_0000003"]
