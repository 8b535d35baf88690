"""Qwen3-MoE (model.family qwen3_moe) end to end, checked against transformers' Qwen3MoeForCausalLM:
our export loads there with our logits (fp32, within 1e-5), its MTP module is written under the names
SGLang's Qwen3MoeForCausalLMMTP reads and computes our MTP logits through transformers' decoder layer,
every layout round-trips bitwise, and a model transformers built (softmax routing without
renormalisation, dense layers by decoder_sparse_step and mlp_only_layers) imports with its logits and
exports back to its own tensors."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.convert.drop_mtp import drop_mtp
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.errors import UserError
from tests.convert.conftest import TRAIN_OVERRIDES, megatron_forward
from tests.convert.helpers import hf_tensors, megatron_cli, same_tree
from tests.convert.mtp_reference import SGLANG_QWEN3_MTP, mtp_logits

transformers = pytest.importorskip("transformers")

OVERRIDES = [o for o in TRAIN_OVERRIDES if not o.startswith("model.router_group_topk")]  # Qwen3 has no groups


@pytest.fixture(scope="module")
def qwen_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("qwen_run") / "run"
    megatron_cli("train", "configs/qwen3_moe_tiny_cpu.yaml", "--run-dir", str(run_dir), "--max-steps", "3",
                 *OVERRIDES)
    return run_dir


@pytest.fixture(scope="module")
def qwen_logits(qwen_run, tokens, tmp_path_factory):
    return megatron_forward(qwen_run, tokens, tmp_path_factory.mktemp("qwen_logits") / "out.pt")


@pytest.fixture(scope="module")
def qwen_export(qwen_run, tmp_path_factory):
    return export_to_hf(qwen_run, tmp_path_factory.mktemp("qwen_export") / "fp32", mtp="separate", dtype="fp32")


def _load(path):
    model, info = transformers.Qwen3MoeForCausalLM.from_pretrained(
        path, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    return model.eval(), info


def test_export_loads_in_transformers_with_our_logits(qwen_export, qwen_logits, tokens):
    model, info = _load(qwen_export / "main")
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    cfg = json.loads((qwen_export / "main" / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3MoeForCausalLM"] and cfg["model_type"] == "qwen3_moe"
    assert (cfg["num_key_value_heads"], cfg["head_dim"], cfg["num_experts"]) == (2, 48, 8)
    assert cfg["norm_topk_prob"] is True and cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    with torch.no_grad():
        logits = model(torch.load(tokens)).logits
    assert logits.shape == qwen_logits["logits"].shape
    assert (logits - qwen_logits["logits"]).abs().max().item() < 1e-5
    # the MTP module under SGLang's names: nothing else, no embedding or head copy (it shares the target's)
    names = set(json.loads((qwen_export / "mtp" / "model.safetensors.index.json").read_text())["weight_map"])
    assert {"mtp." + n for n in SGLANG_QWEN3_MTP} <= names
    assert all(n.startswith("mtp.layers.0.") for n in names - {"mtp." + n for n in SGLANG_QWEN3_MTP})
    assert {"mtp.layers.0.self_attn.q_norm.weight", "mtp.layers.0.mlp.gate.weight"} <= names
    ours = mtp_logits(qwen_export / "main", qwen_export / "mtp", torch.load(tokens))
    assert (ours[0] - qwen_logits["mtp_logits"][0]).abs().max().item() < 1e-5


def test_every_layout_round_trips_bitwise(qwen_run, qwen_export, tmp_path):
    inline = export_to_hf(qwen_run, tmp_path / "inline", mtp="inline", dtype="bf16", serve_for="sglang")
    assert "--speculative-algorithm NEXTN" in (inline / "SERVING.md").read_text().replace(" \\\n    ", " ")
    ckpt = import_from_hf(inline, tmp_path / "ckpt", dtype="bf16")
    same_tree(export_to_hf(ckpt, tmp_path / "again", mtp="inline", dtype="bf16"), inline)
    a, b = hf_tensors(inline), hf_tensors(qwen_export / "main", qwen_export / "mtp")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].to(torch.bfloat16)) for k in a)
    back = import_from_hf(qwen_export / "main", tmp_path / "from_sep", mtp_dir=qwen_export / "mtp")
    same_tree(export_to_hf(back, tmp_path / "sep_again", dtype="fp32"), qwen_export)
    with pytest.raises(UserError, match="Qwen3-MoE names its MTP module its own way"):
        export_to_hf(qwen_run, tmp_path / "nextn", mtp="separate", mtp_layout="nextn")
    with pytest.raises(UserError, match="vLLM's Qwen3MoeForCausalLM loader stops at tensor names"):
        export_to_hf(qwen_run, tmp_path / "vllm", serve_for="vllm", mtp="inline")
    with pytest.raises(UserError, match="vLLM has no MTP draft model for Qwen3MoeForCausalLM"):
        export_to_hf(qwen_run, tmp_path / "vllm", serve_for="vllm", mtp="separate")
    assert not (tmp_path / "nextn").exists() and not (tmp_path / "vllm").exists()
    none = export_to_hf(qwen_run, tmp_path / "none", mtp="none", dtype="fp32")
    same_tree(none, qwen_export / "main")
    # --for an engine without a Qwen3-MoE draft writes what it serves: the main model alone
    same_tree(export_to_hf(qwen_run, tmp_path / "for_vllm", serve_for="vllm", dtype="fp32"), none)
    dropped = drop_mtp(export_to_hf(qwen_run, tmp_path / "inline32", mtp="inline", dtype="fp32"), tmp_path / "dropped")
    a, b = hf_tensors(dropped), hf_tensors(none)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_transformers_built_model_imports_with_its_logits(tokens, tmp_path):
    # six layers: MoE at 1, 3, 5 by decoder_sparse_step 2, and 3 dense again by mlp_only_layers
    cfg = transformers.Qwen3MoeConfig(
        vocab_size=4096, hidden_size=64, intermediate_size=160, num_hidden_layers=6, num_attention_heads=4,
        num_key_value_heads=2, head_dim=24, moe_intermediate_size=48, num_experts_per_tok=2, num_experts=8,
        decoder_sparse_step=2, mlp_only_layers=[3], norm_topk_prob=False, max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1000000.0}, rms_norm_eps=1e-6)
    torch.manual_seed(0)
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    assert [type(layer.mlp).__name__ for layer in model.model.layers].count("Qwen3MoeSparseMoeBlock") == 2
    with torch.no_grad():  # weights that transformers initialises to constants get values of their own
        for name, param in model.named_parameters():
            if "norm" in name or "gate.weight" in name:
                param.add_(torch.randn_like(param) * 0.1)
        reference = model(torch.load(tokens)).logits
    model.save_pretrained(tmp_path / "hf")
    ckpt = import_from_hf(tmp_path / "hf", tmp_path / "ckpt")
    ours = megatron_forward(ckpt, tokens, tmp_path / "out.pt")
    assert ours["mtp_logits"] == []
    assert (ours["logits"] - reference).abs().max().item() < 1e-5
    a, b = hf_tensors(export_to_hf(ckpt, tmp_path / "back", mtp="none", dtype="fp32")), hf_tensors(tmp_path / "hf")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)


def test_what_the_format_cannot_hold_is_one_sentence():
    from megatron_mtp.models.family import get_family

    family = get_family("qwen3_moe")
    base = {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "vocab_size": 64, "hidden_size": 32,
        "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2}
    assert family.from_hf_config(base)[0].moe_layer_rule().count == 2
    for change, sentence in (({"attention_bias": True}, "'attention_bias' = True cannot be represented"),
                             ({"use_sliding_window": True}, "'use_sliding_window' = True cannot be represented"),
                             ({"mlp_only_layers": [2]}, "mlp_only_layers names layer 2, outside the 2 layers"),
                             ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn' is not"),
                             ({"decoder_sparse_step": 0}, "decoder_sparse_step is 0; it must be a positive"),
                             ({"moe_gate_bias": 1}, "field 'moe_gate_bias' is not understood")):
        with pytest.raises(UserError, match=sentence):
            family.from_hf_config({**base, **change}, "config.json")
    model, mtp, _ = family.from_hf_config(base)
    for key, value in (("router_score_function", "sigmoid"), ("num_shared_experts", 1),
                       ("router_enable_expert_bias", True)):
        with pytest.raises(UserError, match=f"model.{key}=.* cannot be written in the Qwen3-MoE format"):
            family.to_hf_config(type(model)(**{**model.__dict__, key: value}), mtp, vocab_size=64,
                                num_nextn_predict_layers=0)
