"""The model family: one typed ``Family`` per folder, registered once, read by every consumer; its own
config fields with it; one "is MoE" rule; recorded in checkpoints and fixed on resume.

The last test defines a family inside the test alone (a renamed grouped-query family with a field of
its own) and takes it through ``train --print-config``, ``plan`` and the tensor table, in a fresh
interpreter, without a line of shared code naming it.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_mtp.checkpoint.resume_rules import MEANING
from megatron_mtp.config import config_from_dict, load_config
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import Family, families, get_family

ROOT = Path(__file__).resolve().parents[2]


def test_the_installed_families_are_registered_once_and_typed():
    names = [f.name for f in families()]
    assert names == ["deepseek_v3", "deepseek_v32", "gemma4", "glm4_moe", "glm_moe_dsa", "qwen3_moe"]
    for family in families():
        assert isinstance(family, Family) and get_family(family.name) is family
        for f in dataclasses.fields(Family):
            if f.default is None:  # an optional member (a family whose layers differ, a multimodal checkpoint)
                continue
            assert getattr(family, f.name) is not None, (family.name, f.name)
        assert family.architecture == family.hf_architectures[0]


def test_deepseek_v3_is_the_default_and_others_are_refused():
    assert load_config(None).model.family == "deepseek_v3"
    with pytest.raises(UserError, match="model.family"):
        load_config(None, ["model.family=glm4_moe_unknown"])
    with pytest.raises(UserError, match="not a model family"):
        get_family("gpt2")


def test_the_family_fields_live_with_the_family():
    """GLM's grouped-query fields are not DeepSeek's and the reverse, each refused in one sentence; a
    config.yaml saved when every family's fields sat in one class (the other family's at their
    defaults) still loads; the override of model.family applies first, whatever its place."""
    glm = load_config(None, ["model.num_query_groups=2", "model.family=glm4_moe"])
    assert type(glm.model).__name__ == "Glm4MoeModelConfig" and glm.model.num_query_groups == 2
    assert not hasattr(glm.model, "q_lora_rank") and not hasattr(load_config(None).model, "num_query_groups")
    with pytest.raises(UserError, match=r"^model.num_query_groups is a field of model.family=gemma4 or "
                                        r"model.family=glm4_moe or model.family=qwen3_moe, not of "
                                        r"model.family=deepseek_v3; remove it or set model.family=gemma4$"):
        load_config(None, ["model.num_query_groups=2"])
    with pytest.raises(UserError, match=r"model.yarn is a field of model.family=deepseek_v3 or "
                                        r"model.family=deepseek_v32 or model.family=glm_moe_dsa, not of "
                                        r"model.family=glm4_moe"):
        load_config(str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml"), ["model.yarn.factor=4"])
    old = load_config(str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml")).to_dict()
    old["model"].update(q_lora_rank=64, kv_lora_rank=32, qk_head_dim=32, qk_pos_emb_head_dim=16, v_head_dim=32,
                        yarn=load_config(None).to_dict()["model"]["yarn"])
    assert config_from_dict(old).to_dict() == load_config(str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml")).to_dict()
    with pytest.raises(UserError, match="q_lora_rank is a field of model.family=deepseek_v3"):
        config_from_dict({**old, "model": {**old["model"], "q_lora_rank": 8}})


def test_a_resume_may_not_change_the_family():
    assert "model.family" in MEANING


def test_one_moe_rule_for_the_model_megatron_core_plan_and_config_json():
    """The tensor table, the megatron-core layer pattern, plan and the exported config.json's view
    agree on which layers are MoE, for every family."""
    from megatron_mtp.models.megatron_config import moe_layer_pattern
    from megatron_mtp.models.tensor_table import is_moe_layer, moe_layers

    for name, path in (("deepseek_v3", "deepseek_v3_671b.yaml"), ("glm4_moe", "glm4_5_air.yaml")):
        cfg = load_config(str(ROOT / "configs" / path))
        family, m = get_family(name), cfg.model
        table = [is_moe_layer(m, i) for i in range(m.num_layers)]
        hf = family.to_hf_config(m, cfg.mtp, vocab_size=1024, num_nextn_predict_layers=1).to_dict()
        view = family.hf_view(hf, "config.json")
        assert table == [bool(x) for x in moe_layer_pattern(cfg)] == [view.is_moe_layer(i) for i in range(m.num_layers)]
        assert table[:m.first_k_dense] == [False] * m.first_k_dense and all(table[m.first_k_dense:])
        assert moe_layers(m).mtp and view.is_moe_layer(m.num_layers) and moe_layers(m).count == view.moe_layers.count


def test_a_family_defined_in_a_test_needs_no_shared_code(tmp_path):
    code = textwrap.dedent('''
        import dataclasses, json, sys
        from dataclasses import dataclass
        from megatron_mtp.cli import main
        from megatron_mtp.errors import UserError
        from megatron_mtp.models import glm4_moe
        from megatron_mtp.models.family import register, get_family
        from megatron_mtp.models.glm4_moe.model_config import Glm4MoeModelConfig

        @dataclass
        class ToyModelConfig(Glm4MoeModelConfig):
            toy_gate: float = 0.5
            """A field only the toy family has."""

            def check(self, cfg):
                super().check(cfg)
                if not 0 < self.toy_gate <= 1:
                    raise UserError(f"model.toy_gate={self.toy_gate} must be in (0, 1]")

        register(dataclasses.replace(glm4_moe.FAMILY, name="toy_moe", title="Toy", model_config=ToyModelConfig,
                                     hf_architectures=("ToyMoeForCausalLM",), hf_model_types=("toy_moe",)))
        overrides = ["model.family=toy_moe", "model.toy_gate=0.25", "model.num_query_groups=2", "mtp.num_layers=1"]
        assert main(["train", "CONFIG", "--print-config", *overrides]) == 0
        print("=====")
        assert main(["plan", "CONFIG", "--gpus-per-node", "1", "--json", *overrides]) == 0
        print("=====")
        assert main(["plan", "CONFIG", "--gpus-per-node", "1", "--json", *overrides[2:]]) == 0  # as glm4_moe
        print("=====")
        from megatron_mtp.config import load_config
        cfg = load_config("CONFIG", overrides)
        table = get_family(cfg.model.family).param_table(cfg.model, cfg.mtp.modules, spec="te")
        print(json.dumps([p.mcore for p in table]))
        print("=====")
        print("exit", main(["train", "CONFIG", "--print-config", *overrides[:1], "model.toy_gate=2"]))
        assert "torch" not in sys.modules, "naming a family imported torch"
    ''').replace("CONFIG", str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml"))
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    printed, plan, glm_plan, table, refused = proc.stdout.split("=====\n")
    assert "family: toy_moe" in printed and "toy_gate: 0.25" in printed and "num_query_groups: 2" in printed
    plan, glm_plan = json.loads(plan), json.loads(glm_plan)
    assert plan["ranks"][0]["params_bytes"] == glm_plan["ranks"][0]["params_bytes"] > 0  # the same table
    assert plan["ranks"][0]["activation_bytes"] == glm_plan["ranks"][0]["activation_bytes"] > 0
    table = json.loads(table)
    assert "decoder.layers.0.self_attention.linear_qkv.weight" in table
    assert any(k.startswith("mtp.layers.0.") for k in table)
    assert "model.toy_gate=2.0 must be in (0, 1]" in proc.stderr and refused.strip() == "exit 2"
