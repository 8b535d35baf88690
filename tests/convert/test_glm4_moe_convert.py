"""GLM-4.5 (model.family glm4_moe) end to end, checked against transformers' Glm4MoeForCausalLM:
our export loads there with our logits, a model transformers built imports with its logits, every
MTP layout round-trips bitwise, and transformers drafts with our MTP layer."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.conftest import TRAIN_OVERRIDES, megatron_forward
from tests.convert.helpers import hf_tensors, megatron_cli, same_tree
from tests.convert.mtp_reference import mtp_logits

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def glm_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("glm_run") / "run"
    megatron_cli("train", "configs/glm4_moe_tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "3",
                 *TRAIN_OVERRIDES)
    return run_dir


@pytest.fixture(scope="module")
def glm_logits(glm_run, tokens, tmp_path_factory):
    return megatron_forward(glm_run, tokens, tmp_path_factory.mktemp("glm_logits") / "out.pt")


@pytest.fixture(scope="module")
def glm_export(glm_run, tmp_path_factory):
    return export_to_hf(glm_run, tmp_path_factory.mktemp("glm_export") / "fp32", mtp="separate", dtype="fp32")


def _load(path):
    model, info = transformers.Glm4MoeForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def test_export_loads_in_transformers_with_our_logits(glm_export, glm_logits, tokens):
    model, info = _load(glm_export / "main")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    cfg = json.loads((glm_export / "main" / "config.json").read_text())
    assert cfg["architectures"] == ["Glm4MoeForCausalLM"] and cfg["num_key_value_heads"] == 2
    assert cfg["head_dim"] == 48 and cfg["partial_rotary_factor"] == 0.5 and cfg["use_qk_norm"] is True
    # the bias and q/k norms are there, so they take part in the logits compared below
    names = json.loads((glm_export / "main" / "model.safetensors.index.json").read_text())["weight_map"]
    assert {"model.layers.0.self_attn.k_proj.bias", "model.layers.0.self_attn.q_norm.weight"} <= names.keys()
    with torch.no_grad():
        logits = model(torch.load(tokens)).logits
    assert logits.shape == glm_logits["logits"].shape
    assert (logits - glm_logits["logits"]).abs().max().item() < 1e-4
    ours = mtp_logits(glm_export / "main", glm_export / "mtp", torch.load(tokens))
    assert (ours[0] - glm_logits["mtp_logits"][0]).abs().max().item() < 1e-4


def test_every_layout_round_trips_bitwise(glm_run, glm_export, tmp_path):
    inline = export_to_hf(glm_run, tmp_path / "inline", mtp="inline", dtype="bf16")
    ckpt = import_from_hf(inline, tmp_path / "ckpt", dtype="bf16")
    same_tree(export_to_hf(ckpt, tmp_path / "again", mtp="inline", dtype="bf16"), inline)
    # separate (release naming and SGLang's NextN naming) holds the same tensors as inline
    a, b = hf_tensors(inline), hf_tensors(glm_export / "main", glm_export / "mtp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].to(torch.bfloat16)) for k in a if "correction" not in k)
    sep = export_to_hf(glm_run, tmp_path / "sep", dtype="fp32")
    a, b = hf_tensors(sep / "main", sep / "mtp"), hf_tensors(glm_export / "main", glm_export / "mtp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    nextn = export_to_hf(glm_run, tmp_path / "nextn", mtp="separate", mtp_layout="nextn", dtype="fp32")
    assert json.loads((nextn / "mtp" / "config.json").read_text())["architectures"] == ["Glm4MoeForCausalLMNextN"]
    back = import_from_hf(nextn / "main", tmp_path / "from_nextn", mtp_dir=nextn / "mtp")
    same_tree(export_to_hf(back, tmp_path / "sep_again", dtype="fp32"), glm_export)
    # none, and drop-mtp of an inline export and of the checkpoint, give the main model alone
    none = export_to_hf(glm_run, tmp_path / "none", mtp="none", dtype="fp32")
    same_tree(none, glm_export / "main")
    dropped_hf = drop_mtp(export_to_hf(glm_run, tmp_path / "inline32", mtp="inline", dtype="fp32"),
                          tmp_path / "dropped")
    a, b = hf_tensors(dropped_hf), hf_tensors(none)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert json.loads((dropped_hf / "config.json").read_text())["num_nextn_predict_layers"] == 0
    dropped = drop_mtp(glm_run, tmp_path / "dropped_ckpt")
    assert not any(k.startswith("mtp.") for k in TorchDistReader(dropped).keys())
    same_tree(export_to_hf(dropped, tmp_path / "none_again", mtp="none", dtype="fp32"), none)


def test_transformers_built_model_imports_with_its_logits(tokens, tmp_path):
    cfg = transformers.Glm4MoeConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, moe_intermediate_size=48, num_experts_per_tok=2, n_shared_experts=1,
        n_routed_experts=8, n_group=2, topk_group=1, first_k_dense_replace=1, routed_scaling_factor=2.5,
        use_qk_norm=True, attention_bias=True, num_nextn_predict_layers=0, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})
    torch.manual_seed(0)
    model = transformers.Glm4MoeForCausalLM(cfg).eval()
    with torch.no_grad():  # weights that transformers initialises to constants get values of their own
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias") or "gate.weight" in name:
                param.add_(torch.randn_like(param) * 0.1)
        for layer in model.model.layers[1:]:
            layer.mlp.gate.e_score_correction_bias.copy_(torch.randn(8) * 0.1)
        reference = model(torch.load(tokens)).logits
    model.save_pretrained(tmp_path / "hf")
    with pytest.raises(UserError, match="num_query_groups=2 is not divisible by parallel.tensor=4"):
        # refused before anything is written
        import_from_hf(tmp_path / "hf", tmp_path / "tp4", overrides=["parallel.tensor=4"])
    assert not (tmp_path / "tp4").exists()
    ckpt = import_from_hf(tmp_path / "hf", tmp_path / "ckpt")
    ours = megatron_forward(ckpt, tokens, tmp_path / "out.pt")
    assert ours["mtp_logits"] == []
    assert (ours["logits"] - reference).abs().max().item() < 1e-4
    # and it goes back to the same tensors transformers saved
    a, b = hf_tensors(export_to_hf(ckpt, tmp_path / "back", mtp="none", dtype="fp32")), hf_tensors(tmp_path / "hf")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)


def test_transformers_drafts_with_our_mtp_layer(glm_run, tmp_path):
    inline = export_to_hf(glm_run, tmp_path / "inline", mtp="inline", dtype="fp32")
    model, info = _load(inline)
    assert not info["missing_keys"]
    model._keys_to_ignore_on_load_unexpected = [r"model\.layers\.4\."]  # as OUT/SERVING.md tells
    assert "model._keys_to_ignore_on_load_unexpected" in (inline / "SERVING.md").read_text()
    ids = torch.tensor([[5, 17, 300, 42, 9, 77, 3]])
    model.generation_config.eos_token_id = None  # a fixed number of tokens, as ignore_eos below
    plain = model.generate(ids, max_new_tokens=16, do_sample=False)
    drafted = model.generate(ids, max_new_tokens=16, do_sample=False, use_mtp=True)
    assert torch.equal(plain, drafted)
    # and our decoder drafts with the same export: speculative greedy == transformers' plain greedy
    from megatron_mtp.inference.generate import load_generator

    ours = load_generator(inline).generate(ids[0].tolist(), max_new_tokens=16, ignore_eos=True, speculative_k=1)
    assert ours.tokens == plain[0, ids.shape[1]:].tolist()
    assert ours.stats.target_forwards <= 16


def test_fp8_export_quantises_q_k_v_and_round_trips(glm_run, tmp_path):
    fp8 = export_to_hf(glm_run, tmp_path / "fp8", mtp="inline", dtype="fp8")
    tensors = hf_tensors(fp8)
    for proj in ("q", "k", "v", "o"):
        assert tensors[f"model.layers.4.self_attn.{proj}_proj.weight"].dtype == torch.float8_e4m3fn, proj
        assert f"model.layers.4.self_attn.{proj}_proj.weight_scale_inv" in tensors
    assert tensors["model.layers.0.self_attn.q_proj.bias"].dtype == torch.bfloat16
    assert tensors["model.layers.0.self_attn.q_norm.weight"].dtype == torch.bfloat16
    assert tensors["model.layers.4.eh_proj.weight"].dtype == torch.bfloat16
    ckpt = import_from_hf(fp8, tmp_path / "ckpt")
    same_tree(export_to_hf(ckpt, tmp_path / "again", mtp="inline", dtype="fp8"), fp8)
