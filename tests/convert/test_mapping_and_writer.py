"""Pure-CPU checks of the mapping table (MTP indices from the config) and the safetensors writer."""

import json

import pytest
import torch
from safetensors import safe_open

from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import HFDir, PlannedTensor, ShardedSafetensorsWriter
from megatron_mtp.models.deepseek_v3.hf_mapping import param_table
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig as ModelConfig
from megatron_mtp.models.tensor_table import extra_state_keys, is_mtp_hf_name, nextn_name


@pytest.mark.parametrize("layers, depth", [(61, 1), (7, 2), (3, 0)])
def test_mtp_layer_indices_come_from_the_config(layers, depth):
    model = ModelConfig(num_layers=layers, num_experts=4, first_k_dense=1)
    table = param_table(model, depth, spec="local")
    mtp_names = {n for p in table if p.part == "mtp" for n in p.hf_names()}
    assert {int(n.split(".")[2]) for n in mtp_names} == set(range(layers, layers + depth))
    assert all(is_mtp_hf_name(n, layers) for n in mtp_names)
    main_names = [n for p in table if p.part == "main" for n in p.hf_names()]
    assert not any(is_mtp_hf_name(n, layers) for n in main_names)
    assert len(main_names) == len(set(main_names))
    if depth:
        assert nextn_name(f"model.layers.{layers}.eh_proj.weight", layers) == "model.layers.0.eh_proj.weight"
        assert nextn_name(f"model.layers.{layers}.embed_tokens.weight", layers) is None


def test_experts_and_fused_fc1_rules():
    model = ModelConfig(num_layers=2, num_experts=3, first_k_dense=1)
    by_key = {p.mcore: p for p in param_table(model, 1, spec="local")}
    experts = by_key["decoder.layers.1.mlp.experts.experts.linear_fc1.weight"]
    assert experts.hf_names()[:2] == ["model.layers.1.mlp.experts.0.gate_proj.weight",
                                      "model.layers.1.mlp.experts.0.up_proj.weight"]
    assert len(experts.hf_names()) == 6
    assert by_key["decoder.layers.0.mlp.linear_fc1.weight"].hf == ("model.layers.0.mlp.gate_proj.weight",
                                                                   "model.layers.0.mlp.up_proj.weight")
    assert by_key["mtp.layers.0.transformer_layer.self_attention.linear_proj.weight"].hf == (
        "model.layers.2.self_attn.o_proj.weight",)
    assert extra_state_keys(experts)[-1] == "decoder.layers.1.mlp.experts.experts.linear_fc1._extra_state/shard_2_3"
    te = {p.mcore for p in param_table(model, 1, spec="te")}
    assert "decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight" in te
    assert "decoder.layers.0.self_attention.q_layernorm.weight" not in te


def test_writer_shards_index_and_order(tmp_path):
    tensors = {f"t{i}": torch.randn(64, 32).to(torch.bfloat16 if i % 2 else torch.float32) for i in range(6)}
    plan = [PlannedTensor(n, tuple(t.shape), t.dtype) for n, t in tensors.items()]
    writer = ShardedSafetensorsWriter(tmp_path, plan, max_shard_bytes=3 * 64 * 32 * 4)
    for name, t in tensors.items():
        writer.write(name, t)
    weight_map = writer.finish()
    assert len(set(weight_map.values())) > 1
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    assert index["metadata"]["total_size"] == sum(t.numel() * t.element_size() for t in tensors.values())
    for name, t in tensors.items():
        with safe_open(str(tmp_path / weight_map[name]), "pt") as h:
            assert torch.equal(h.get_tensor(name), t)
    (tmp_path / "config.json").write_text("{}")
    assert torch.equal(HFDir(tmp_path).get("t3"), tensors["t3"])
    with pytest.raises(ValueError, match="expected t0"):
        ShardedSafetensorsWriter(tmp_path / "b", plan).write("t1", tensors["t1"])


def test_hf_dir_with_index_naming_a_wrong_file_is_an_error(tmp_path):
    writer = ShardedSafetensorsWriter(tmp_path, [PlannedTensor("a", (2,), torch.float32)])
    writer.write("a", torch.ones(2))
    writer.finish()
    (tmp_path / "config.json").write_text("{}")
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["b"] = index["weight_map"]["a"]
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(UserError, match="does not hold it"):
        HFDir(tmp_path)
