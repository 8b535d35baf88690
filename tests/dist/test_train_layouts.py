"""Every parallel layout trains like one process, and checkpoints move between layouts.

Every layout starts from scratch with the same seed: the initial weights do not depend on the layout
(models/initialization.py), so each layout's step-1 losses equal the one-process run's to float32
reduction order, and the 3 steps on the same global batches stay together.
"""

from __future__ import annotations

import json

import pytest
import torch
from scalars import compare_scalars, values

from tests.dist.conftest import run_as_of

pytestmark = [pytest.mark.dist, pytest.mark.mcore]

LAYOUTS = {
    "tp2": (2, ("parallel.tensor=2",)),
    "pp2": (2, ("parallel.pipeline=2",)),
    "ep2": (2, ("parallel.expert=2",)),
    "tp2_pp2_ep2": (8, ("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2")),
    # DeepSeek-V3 recipes' folding: experts over the tensor ranks (expert TP 1), refused before it
    "tp2_etp1_ep2": (2, ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1")),
    # context parallelism: each sequence over 2 ranks (the local attention gathers keys and values), experts
    # over the same ranks; and with sequence parallelism over TP inside each CP rank's chunks
    "cp2_ep2": (2, ("parallel.context=2", "parallel.expert=2")),
    "tp2_cp2": (4, ("parallel.tensor=2", "parallel.context=2")),
    # the output layer's loss in chunks of 100 of the 1,024 tokens (sequence parallel, MTP on the last stage)
    "tp2_pp2_chunked": (4, ("parallel.tensor=2", "parallel.pipeline=2", "kernels.chunked_output_loss=true",
                            "kernels.output_loss_chunk=100")),
}
STEPS = 3
EVAL = ("logging.eval_interval=1", "logging.eval_steps=2")
# Every logged scalar except timings and memory must not depend on the layout. Losses agree to float32
# reduction order; the grad norm (~1.8) agrees to 5e-5 at step 1 and drifts with the weights after it;
# acceptance, accuracy and expert loads count argmax/routing decisions, of which a near-tie may flip
# (one position in ~500 changes acceptance by 0.002).
TOLERANCE = {"train/grad_norm": 1e-2, "train/grad_norm_max": 1e-2, "train/mtp_acceptance_1": 1e-2,
             "train/mtp_accuracy_1": 1e-2, "valid/mtp_acceptance_1": 1e-2, "moe/max_violation": 2e-2}


@pytest.fixture(scope="module")
def reference(tmp_path_factory, train, metrics):
    root = tmp_path_factory.mktemp("layouts")
    single = root / "single"
    train(single, steps=STEPS, overrides=EVAL)
    return root, metrics(single)


def test_runs_show_reports_the_held_out_loss_the_trainer_logged(reference, capsys):
    from megatron_mtp.cli import main

    root, single = reference
    assert main(["runs", "show", str(root / "single"), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["eval_lm_loss"] == values(single, "valid/lm_loss")[-1]


def assert_same_first_step(got: list[dict], want: list[dict], what: str) -> None:
    """Before any update, the losses differ by float32 reduction order only."""
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        a, b = values(got, key)[0], values(want, key)[0]
        assert abs(a - b) < 1e-5, (what, key, a, b)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_single_process(reference, name, train, metrics):
    root, single = reference
    nproc, overrides = LAYOUTS[name]
    run = root / name
    proc = train(run, nproc=nproc, steps=STEPS, overrides=(*overrides, *EVAL))
    if "parallel.context=2" in overrides:  # the start-up line names the context-parallel ranks
        assert "× CP2 × DP" in proc.stdout, proc.stdout[-2000:]
    rows = [r for r in metrics(run) if "train/lm_loss" in r]
    evals = [r for r in metrics(run) if "valid/lm_loss" in r]
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    assert_same_first_step(rows, single, name)
    keys = compare_scalars(rows + evals, single, name, TOLERANCE)
    assert {"train/lm_loss", "train/mtp_loss_1", "train/grad_norm", "train/mtp_acceptance_1", "moe/balance_loss",
            "moe/max_violation", "valid/lm_loss", "valid/mtp_loss_1"} <= set(keys)
    assert all(len(values(single, key)) == STEPS for key in keys)
    # and it learns: the validation loss (same held-out batches each time) goes down
    valid = values(evals, "valid/lm_loss")
    assert valid[-1] < valid[0], valid
    state = (run / "checkpoints" / "latest").read_text().strip()
    info = (run / "checkpoints" / state / "train_state.json").read_text()
    assert f'"world_size": {nproc}' in info


def test_tp2_pp2_ep2_checkpoint_loads_at_tp1_with_equal_logits(reference, tmp_path, train, probe_logits):
    root, _ = reference
    run = root / "tp2_pp2_ep2"
    if not (run / "checkpoints" / "latest").exists():  # running this test alone
        nproc, overrides = LAYOUTS["tp2_pp2_ep2"]
        train(run, nproc=nproc, steps=1, overrides=overrides)
    tokens = torch.randint(0, 1000, (2, 64), generator=torch.Generator().manual_seed(3))
    torch.save(tokens, tmp_path / "tokens.pt")
    at_tp1 = probe_logits(run, tmp_path / "tokens.pt", tmp_path / "tp1.pt")
    at_8 = probe_logits(run, tmp_path / "tokens.pt", tmp_path / "p8.pt", nproc=8,
                        overrides=("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2"))
    assert at_tp1["logits"].shape == at_8["logits"].shape
    assert (at_tp1["logits"] - at_8["logits"]).abs().max() < 1e-5
    assert len(at_tp1["mtp_logits"]) == 1
    assert (at_tp1["mtp_logits"][0] - at_8["mtp_logits"][0]).abs().max() < 1e-5
    # the MTP head is a different function from the main head
    assert (at_tp1["mtp_logits"][0] - at_tp1["logits"]).abs().max() > 1e-3


@pytest.mark.parametrize("layout", ["even", "Ett|t|t|mL"], ids=["even", "mtp_alone_in_last_chunk"])
def test_interleaved_pipeline_matches_single_process(tmp_path, train, metrics, layout):
    """PP2 x VPP2 (the interleaved schedule, MTP in the last chunk) trains like one process."""
    start = ("model.num_layers=4", *EVAL)
    single, vpp = tmp_path / "single", tmp_path / "vpp"
    train(single, steps=STEPS, overrides=start)
    chunks = ("parallel.virtual_pipeline=2",) if layout == "even" else (f"parallel.pipeline_layout={layout}",)
    proc = train(vpp, nproc=2, steps=STEPS, overrides=(*start, "parallel.pipeline=2", *chunks))
    assert "PP2 (VPP2)" in proc.stdout
    assert_same_first_step(metrics(vpp), metrics(single), layout)
    compare_scalars(metrics(vpp), metrics(single), layout, TOLERANCE)


def test_resume_at_another_virtual_pipeline_size(tmp_path, train, metrics):
    """Saved by one process, resumed with optimizer state at PP2 x VPP2: the run goes on as if uninterrupted."""
    four = ("model.num_layers=4", "schedule.decay_style=cosine", "schedule.decay_steps=5", "schedule.warmup_steps=1")
    straight = tmp_path / "straight"
    train(straight, steps=4, overrides=(*four, *KEEP_STEP_2))
    moved = run_as_of(straight, tmp_path / "moved", 2)
    second = train(moved, nproc=2, steps=4, overrides=(*four, "parallel.pipeline=2", "parallel.virtual_pipeline=2"))
    assert "at step 2" in second.stdout
    a, b = metrics(straight), metrics(moved)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for x, y in zip(a[2:], b[2:]):
        for key in ("train/lm_loss", "train/mtp_loss_1", "train/lr"):
            assert abs(x[key] - y[key]) < 2e-3, (x["step"], key, x[key], y[key])


@pytest.mark.parametrize("layout", ["[3,1]", "[4,0]"], ids=["short_last_stage", "mtp_alone_on_last_stage"])
def test_uneven_pipeline_layout_matches_single_process(tmp_path, train, metrics, layout):
    """parallel.pipeline_layout with a short last stage, or one holding only MTP and the loss (the
    DeepSeek-V3 recipes' final 'mL' stage, which `plan --smallest` also tries), trains like 1 process; there
    a resume after step 1 continues as the uninterrupted run does."""
    start = ("model.num_layers=4",)
    single, uneven = tmp_path / "single", tmp_path / "uneven"
    train(single, steps=2, overrides=start)
    pipeline = (*start, "parallel.pipeline=2", f"parallel.pipeline_layout={layout}")
    if layout == "[4,0]":
        train(uneven, nproc=2, steps=1, overrides=pipeline)
    proc = train(uneven, nproc=2, steps=2, overrides=pipeline)
    assert ("resum" in proc.stdout + proc.stderr) == (layout == "[4,0]")
    a, b = metrics(single), metrics(uneven)
    assert [r["step"] for r in b] == [1, 2]
    assert_same_first_step(b, a, layout)
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        assert max(abs(x[key] - y[key]) for x, y in zip(a, b)) < 2e-3, key


# The grouped-query families: GLM-4.5 (glm4_moe: partial RoPE, qkv bias, DeepSeek-style MoE) and Qwen3-MoE
# (qwen3_moe: full RoPE, softmax top-k routing with a micro-batch balance loss, no shared experts). Their
# attention is split over TP by key/value groups (the q/k norm gradients summed over TP); 4 layers so that
# PP2 x VPP2 has one per chunk. One reference run per family serves its layouts and its resume. The resume
# runs for Qwen3-MoE alone: no resume code is a family's own, and GLM's attention is the same code.
GQA = ("model.num_layers=4", *EVAL)
KEEP_STEP_2 = ("checkpoint.save_interval=2", "checkpoint.keep_last=2", "checkpoint.optimizer_format=reshardable")
"""A run that keeps its step 2 (reshardable: the optimizer state by parameter name) for a resume at another
layout (conftest.run_as_of)."""
GQA_CONFIGS = {"glm": "glm4_moe_tiny_cpu", "qwen3": "qwen3_moe_tiny_cpu"}
GQA_LAYOUTS = {
    "tp2_ep2": ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"),
    "pp2_vpp2": ("parallel.pipeline=2", "parallel.virtual_pipeline=2"),
}
GQA_CASES = [(family, name) for family in GQA_CONFIGS for name in GQA_LAYOUTS]


@pytest.fixture(scope="module")
def gqa_reference(tmp_path_factory, train, metrics):
    """family -> (root, the one-process run's scalars), each trained once when first asked for."""
    done: dict[str, tuple] = {}

    def reference(family: str):
        if family not in done:
            root = tmp_path_factory.mktemp(f"{family}_layouts")
            # its step 2 kept (by parameter name) for the resume test
            train(root / "single", steps=STEPS, overrides=(*GQA, *KEEP_STEP_2), config=GQA_CONFIGS[family])
            done[family] = root, metrics(root / "single")
        return done[family]

    return reference


@pytest.mark.parametrize(("family", "name"), GQA_CASES, ids=[f"{f}-{n}" for f, n in GQA_CASES])
def test_gqa_family_layout_matches_single_process(gqa_reference, family, name, train, metrics):
    root, single = gqa_reference(family)
    train(root / name, nproc=2, steps=STEPS, overrides=(*GQA, *GQA_LAYOUTS[name]), config=GQA_CONFIGS[family])
    rows = [r for r in metrics(root / name) if "train/lm_loss" in r or "valid/lm_loss" in r]
    assert_same_first_step(rows, single, name)
    keys = compare_scalars(rows, single, name, TOLERANCE)
    assert {"train/lm_loss", "train/mtp_loss_1", "train/grad_norm", "valid/lm_loss"} <= set(keys)


@pytest.mark.parametrize("family", ["qwen3"])
def test_gqa_family_resumes_at_another_layout_as_if_uninterrupted(gqa_reference, family, train, metrics):
    """Two steps in one process, the third resumed with optimizer state at PP2 x VPP2."""
    root, single = gqa_reference(family)
    run = run_as_of(root / "single", root / "resumed", 2)
    config = GQA_CONFIGS[family]
    second = train(run, nproc=2, steps=STEPS, overrides=(*GQA, *GQA_LAYOUTS["pp2_vpp2"]), config=config)
    assert "at step 2" in second.stdout
    third = [r for r in metrics(run) if r.get("step") == STEPS and "train/lm_loss" in r]
    want = [r for r in single if r.get("step") == STEPS and "train/lm_loss" in r]
    assert len(third) == len(want) == 1
    # the losses and the update (moe/max_violation also counts the routing of the step-2 evaluation, which
    # the straight run logs with step 3 and the resumed one ran in its first process)
    for key in ("train/lm_loss", "train/mtp_loss_1", "train/lr", "train/grad_norm"):
        assert abs(third[0][key] - want[0][key]) < TOLERANCE.get(key, 2e-3), (key, third[0][key], want[0][key])
