"""The tables and analytic counts describe the model megatron-core really builds (tiny config, one
process on a warm rank; each style built once and read by every check below)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from megatron_mtp.config import load_config, pipeline_layout
from megatron_mtp.config.validate import validate
from megatron_mtp.models.deepseek_v3.hf_mapping import param_table
from megatron_mtp.models.deepseek_v3.sizes import parameter_counts
from megatron_mtp.plan.params import chunk_params
from megatron_mtp.platform import megatron_core

pytestmark = [pytest.mark.dist, pytest.mark.mcore]
ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
STYLES = {"sequential": ["mtp.num_layers=2"], "parallel": ["mtp.style=parallel", "mtp.num_layers=2"]}
REPEATED = ["mtp.num_layers=3", "mtp.repeated_layer=true"]
if megatron_core.is_019():  # megatron-core 0.19's mtp_use_repeated_layer (refused on 0.16: tests/unit/test_platform.py)
    STYLES["repeated"] = REPEATED


@pytest.fixture(scope="module")
def built(tmp_path_factory, script):
    facts = {}
    for style, overrides in STYLES.items():
        out = tmp_path_factory.mktemp("built") / f"{style}.json"
        proc = script("built_model.py", TINY, out, *overrides, timeout=300)
        assert proc.returncode == 0, proc.stderr[-3000:]
        facts[style] = json.loads(out.read_text())
    return facts


def _cfg(style: str):
    return load_config(TINY, ["model.vocab_size=256", *STYLES[style]])


def test_checkpoint_keys_use_te_spelling_and_match_the_mapping_table(built):
    keys = set(built["sequential"]["sharded_keys"])
    assert not any("q_layernorm" in k or "kv_layernorm" in k for k in keys)
    assert "decoder.layers.0.mlp.linear_fc1.layer_norm_weight" in keys  # dense layer (first_k_dense=1)
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys  # MoE layers keep a separate norm
    assert "mtp.layers.1.transformer_layer.self_attention.linear_q_up_proj.layer_norm_weight" in keys

    m = load_config(TINY).model
    table = {p.mcore for p in param_table(m, 2, spec="te", mtp_copies=False)}
    assert table <= keys, sorted(table - keys)
    # every model tensor is claimed by the table (nothing would be dropped on export)
    assert {k for k in keys if not k.endswith("_extra_state")} <= table | {
        k for k in keys if k.startswith("mtp.") and "embedding" in k}, sorted(keys - table)


def test_analytic_counts_equal_the_built_model(built):
    params = built["sequential"]["params"]
    counts = parameter_counts(_cfg("sequential"), 256)
    assert counts["main"] == sum(c for n, c in params if not n.startswith("mtp."))
    assert counts["mtp_unique"] == sum(c for n, c in params if n.startswith("mtp."))


def test_analytic_size_equals_the_built_heads(built):
    params = built["parallel"]["params"]
    assert not any(n.startswith("mtp.") for n, _ in params)  # no sequential block, no embedding copy
    counts = parameter_counts(_cfg("parallel"), 256)
    assert counts["main"] == sum(c for n, c in params if not n.startswith("mtp_heads."))
    assert counts["mtp_unique"] == sum(c for n, c in params if n.startswith("mtp_heads."))


def test_plan_parameter_inventory_is_the_built_model(built):
    cfg = _cfg("sequential")
    sizes = validate(cfg, 1)
    (stage,) = pipeline_layout.stages(cfg.model.num_layers, 2, 1, None, None)
    planned = [[p.name, p.numel] for p in chunk_params(cfg, sizes, stage, 256, last=True, te=False)]
    assert built["sequential"]["chunk_params"] == planned


@pytest.mark.skipif(not megatron_core.is_019(), reason="mtp.repeated_layer needs megatron-core 0.19")
def test_a_repeated_mtp_layer_is_one_module_in_the_model_the_plan_the_table_and_the_counts(built):
    facts, cfg = built["repeated"], _cfg("repeated")
    mtp_keys = {k for k in facts["sharded_keys"] if k.startswith("mtp.")}
    assert mtp_keys and all(k.startswith("mtp.layers.0.") for k in mtp_keys), sorted(mtp_keys)
    table = {p.mcore for p in param_table(cfg.model, cfg.mtp.modules, spec="te", mtp_copies=False)}
    assert {k for k in mtp_keys if not k.endswith("_extra_state")} <= table | {k for k in mtp_keys if "embedding" in k}
    assert table <= set(facts["sharded_keys"])
    counts = parameter_counts(cfg, 256)
    assert counts["mtp_unique"] == sum(c for n, c in facts["params"] if n.startswith("mtp."))
    assert counts["mtp_unique"] * 3 == parameter_counts(_cfg("sequential").replace(
        mtp=load_config(TINY, ["mtp.num_layers=3"]).mtp), 256)["mtp_unique"]
    (stage,) = pipeline_layout.stages(cfg.model.num_layers, 3, 1, None, None)
    planned = [[p.name, p.numel] for p in chunk_params(cfg, validate(cfg, 1), stage, 256, last=True, te=False)]
    assert facts["chunk_params"] == planned


GLM = str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml")


def test_glm_table_and_counts_describe_the_built_model(tmp_path, script):
    """GLM-4.5's table (TE spelling: the input norm fused into linear_qkv, which holds the bias; the
    per-head q/k norms) is the checkpoint's keys, and its analytic counts the built parameters."""
    from megatron_mtp.models.family import get_family

    out = tmp_path / "glm.json"
    proc = script("built_model.py", GLM, out, "mtp.num_layers=2", timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(out.read_text())
    keys = {k for k in built["sharded_keys"] if not k.endswith("_extra_state")}
    assert "decoder.layers.1.self_attention.linear_qkv.layer_norm_weight" in keys  # local spec, TE's name
    assert "decoder.layers.1.pre_mlp_layernorm.weight" in keys  # a MoE layer's stays its own
    cfg = load_config(GLM, ["model.vocab_size=256", "mtp.num_layers=2"])
    family = get_family("glm4_moe")
    table = {p.mcore for p in family.param_table(cfg.model, 2, spec="te", mtp_copies=False)}
    assert keys == table | {k for k in keys if k.startswith("mtp.") and "embedding" in k}, sorted(keys ^ table)
    counts = family.parameter_counts(cfg, 256)
    params = built["params"]
    assert counts["main"] == sum(c for n, c in params if not n.startswith("mtp."))
    assert counts["mtp_unique"] == sum(c for n, c in params if n.startswith("mtp."))


@pytest.mark.skipif(not megatron_core.is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")
def test_dsa_table_counts_and_plan_describe_the_built_model(tmp_path, script):
    """The DSA families' table (MLA's latent norms apart in both spellings, the indexer's five tensors in each layer
    that runs its own: GLM-5's layers 0 and 2 and the MTP layer, not layer 1, which reuses layer 0's top-k; every
    layer in DeepSeek-V3.2, the same table code) is the checkpoint's keys, its analytic counts the built
    parameters, and plan's inventory the built parameters in megatron-core's registration order."""
    from megatron_mtp.models.family import get_family

    config = str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml")
    out = tmp_path / "dsa.json"
    proc = script("built_model.py", config, out, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    built = json.loads(out.read_text())
    keys = {k for k in built["sharded_keys"] if not k.endswith("_extra_state")}
    indexer = "self_attention.core_attention.indexer.k_norm.bias"
    assert {f"decoder.layers.{i}.{indexer}" for i in range(3)} & keys == {f"decoder.layers.{i}.{indexer}"
                                                                         for i in (0, 2)}
    assert f"mtp.layers.0.transformer_layer.{indexer}" in keys
    cfg = load_config(config, ["model.vocab_size=256"])
    family = get_family("glm_moe_dsa")
    table = {p.mcore for p in family.param_table(cfg.model, 1, spec="te", mtp_copies=False)}
    assert keys == table | {k for k in keys if k.startswith("mtp.") and "embedding" in k}, sorted(keys ^ table)
    counts = family.parameter_counts(cfg, 256)
    params = built["params"]
    assert counts["main"] == sum(c for n, c in params if not n.startswith("mtp."))
    assert counts["mtp_unique"] == sum(c for n, c in params if n.startswith("mtp."))
    (stage,) = pipeline_layout.stages(cfg.model.num_layers, 1, 1, None, None)
    planned = [[p.name, p.numel] for p in chunk_params(cfg, validate(cfg, 1), stage, 256, last=True, te=False)]
    assert built["chunk_params"] == planned
