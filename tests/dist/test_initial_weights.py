"""From scratch, the same seed builds bitwise the same model at every parallel layout.

Each layout's ranks dump their parameter shards by checkpoint key (tests/dist/scripts/
initial_weights.py); the shards are put back together into whole tensors and compared with the
one-process model's, bit for bit. That the losses then agree is checked in test_train_layouts.py.
"""

from __future__ import annotations

import math

import pytest
import torch

from tests.dist.conftest import ROOT

pytestmark = pytest.mark.dist

CONFIG = ROOT / "configs" / "tiny_cpu.yaml"
FOUR = ("model.num_layers=4",)
LAYOUTS = {
    "tp2": (2, ("parallel.tensor=2",)),
    "pp2": (2, ("parallel.pipeline=2",)),
    "pp2_vpp2": (2, ("parallel.pipeline=2", "parallel.virtual_pipeline=2")),
    "ep2": (2, ("parallel.expert=2",)),
    "tp2_etp1_ep2": (2, ("parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1")),
    "tp2_pp2_ep2": (8, ("parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2")),
}


def whole_tensors(out, nproc: int) -> dict:
    """(key, prepended index) → the whole tensor, from every rank's shards; unfilled elements stay NaN."""
    whole = {}
    for rank in range(nproc):
        for key, index, shape, offset, data in torch.load(out / f"rank-{rank}.pt"):
            full = whole.setdefault((key, index), torch.full(shape, math.nan))
            full[tuple(slice(o, o + s) for o, s in zip(offset, data.shape))] = data
    return whole


@pytest.fixture(scope="module")
def single(tmp_path_factory, script):
    return built_at(CONFIG, (1, ()), tmp_path_factory.mktemp("init") / "single", script)


def built_at(config, layout: tuple, out, script) -> dict:
    """The whole tensors of the model `config` builds at `layout` (nproc, overrides)."""
    nproc, overrides = layout
    proc = script("initial_weights.py", config, out, *FOUR, *overrides, nproc=nproc)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return whole_tensors(out, nproc)


def assert_same_model(got: dict, single: dict, name: str) -> None:
    assert got.keys() == single.keys()
    for ident, want in single.items():
        assert not got[ident].isnan().any(), f"{name}: part of {ident} is held by no rank"
        assert torch.equal(got[ident], want), f"{name}: {ident} differs from the one-process model"


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_initial_weights_are_the_same_at_every_layout(single, name, tmp_path, script):
    assert_same_model(built_at(CONFIG, LAYOUTS[name], tmp_path, script), single, name)


def test_initial_weights_keep_megatron_core_distributions(single):
    """Routed experts differ from each other, and each tensor has the σ megatron-core would use:
    init_method_std, or init_method_std/√(2·layers) for the projections into the residual stream."""
    experts = [t for (key, index), t in single.items() if key.endswith("experts.experts.linear_fc2.weight")]
    assert len(experts) >= 8 and not torch.equal(experts[0], experts[1])
    std, layers = 0.02, 4
    for (key, _), t in single.items():
        if (t == t.reshape(-1)[0]).all():
            continue  # norm weights: ones, as megatron-core sets them
        want = std / math.sqrt(2 * layers) if key.endswith(("linear_proj.weight", "linear_fc2.weight")) else std
        assert abs(t.std().item() / want - 1) < 0.15, (key, t.std().item(), want)
        assert abs(t.mean().item()) < 4 * want / math.sqrt(t.numel()) + 1e-6, key


# The grouped-query families: GLM-4.5's linear_qkv (rows grouped per key/value head, split over TP by
# groups), its bias and q/k norms; Qwen3-MoE's the same without the bias, and its MoE without shared experts
# or expert bias.
GQA_CONFIGS = {"glm": ROOT / "configs" / "glm4_moe_tiny_cpu.yaml",
               "qwen3": ROOT / "configs" / "qwen3_moe_tiny_cpu.yaml"}
BUILT = {**GQA_CONFIGS, "gemma4": ROOT / "configs" / "gemma4_tiny_cpu.yaml"}
GQA_LAYOUTS = {"tp2_etp1_ep2": LAYOUTS["tp2_etp1_ep2"], "pp2_vpp2": LAYOUTS["pp2_vpp2"]}


@pytest.fixture(scope="module")
def gqa_single(tmp_path_factory, script):
    """family -> its one-process model, built once when first asked for."""
    done: dict[str, dict] = {}

    def single(family: str) -> dict:
        if family not in done:
            done[family] = built_at(BUILT[family], (1, ()), tmp_path_factory.mktemp("init") / family, script)
        return done[family]

    return single


@pytest.mark.parametrize("name", list(GQA_LAYOUTS))
@pytest.mark.parametrize("family", list(GQA_CONFIGS))
def test_gqa_family_initial_weights_are_the_same_at_every_layout(gqa_single, family, name, tmp_path, script):
    got = built_at(GQA_CONFIGS[family], GQA_LAYOUTS[name], tmp_path, script)
    keys = {key.rsplit(".", 2)[-2] + "." + key.rsplit(".", 1)[-1] for key, _ in got}
    assert {"q_layernorm.weight", "k_layernorm.weight"} <= keys
    assert ("linear_qkv.bias" in keys) == (family == "glm")
    assert ("shared_experts.linear_fc1.weight" in {".".join(k.split(".")[-3:]) for k, _ in got}) == (family == "glm")
    assert_same_model(got, gqa_single(family), name)


# Gemma 4's own modules: per-kind q/k/v projections split over TP by heads, the value projection only on the
# sliding layers, the router's learned scales, the stacked experts, the layer_scalar buffer.
GEMMA = ROOT / "configs" / "gemma4_tiny_cpu.yaml"


@pytest.mark.parametrize("name", list(GQA_LAYOUTS))
def test_gemma4_initial_weights_are_the_same_at_every_layout(gqa_single, name, tmp_path, script):
    got = built_at(GEMMA, GQA_LAYOUTS[name], tmp_path, script)
    keys = {key for key, _ in got}
    assert "decoder.layers.0.self_attention.linear_v.weight" in keys
    assert "decoder.layers.1.self_attention.linear_v.weight" not in keys  # a full layer: keys are values
    assert "decoder.layers.3.mlp.moe.router.per_expert_scale" in keys
    assert_same_model(got, gqa_single("gemma4"), name)
