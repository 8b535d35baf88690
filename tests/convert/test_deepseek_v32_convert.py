"""The DSA families against transformers. DeepSeek-V3.2 (model.family deepseek_v32): one short run (4 steps, one
process) logs the indexer's KL loss (per layer, the MTP layer's apart) and the MTP acceptance at every step, resumes
exactly from its step-2 checkpoint, and exports a directory that transformers' DeepseekV32ForCausalLM loads with no
missing or unexpected key and our logits. Both families (deepseek_v32, and GLM-5's glm_moe_dsa:
GlmMoeDsaForCausalLM): a random model transformers built (MLA with the lightning indexer, a dense first layer,
sigmoid routing; index_topk below the sequence length, so the indexer decides what each query reads; GLM-5 with one
routing group and IndexShare, its layer 1 reusing layer 0's top-k without an indexer of its own) imports with its
logits and exports back to its own tensors bitwise, which transformers' class loads with no missing or unexpected
key. Needs megatron-core 0.19 (its DSA modules build the model)."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.platform.megatron_core import is_019
from tests.convert.conftest import megatron_forward
from tests.convert.helpers import hf_tensors, megatron_cli
from tests.dist.conftest import metrics, run_as_of

transformers = pytest.importorskip("transformers")

pytestmark = [pytest.mark.mcore,
              pytest.mark.skipif(not is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")]


TRAIN = ["configs/deepseek_v32_tiny_cpu.yaml", "--max-steps", "4", "training.seq_length=32",
         "training.micro_batch_size=2", "training.global_batch_size=2", "logging.eval_interval=0",
         "logging.tensorboard=false", "logging.log_interval=1", "checkpoint.save_interval=2"]


@pytest.fixture(scope="module")
def dsa_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("dsa_run") / "run"
    megatron_cli("train", "--run-dir", str(run_dir), *TRAIN)
    return run_dir


def test_training_logs_the_indexer_loss_and_mtp_acceptance_and_resumes_exactly(dsa_run, tmp_path):
    rows = metrics(dsa_run)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    layers = [f"train/indexer_loss/layer_{n:02d}" for n in (1, 2, 3, 4)]  # 3 decoder layers, then the MTP layer's
    for r in rows:
        assert 0.0 < r["train/indexer_loss"] < 10.0  # the indexer's KL towards the main attention, each step
        assert all(0.0 < r[k] < 10.0 for k in layers), r  # the MTP layer's apart from decoder layer 1's
        assert r["train/indexer_loss"] == pytest.approx(sum(r[k] for k in layers[:3]) / 3)  # the decoder's mean
        assert 0.0 <= r["train/mtp_acceptance_1"] <= 1.0 and r["train/mtp_loss_1"] > 0.0
    assert "indexer_loss" in (dsa_run / "logs" / "train.log").read_text()
    resumed = run_as_of(dsa_run, tmp_path / "resumed", 2)
    megatron_cli("train", "--run-dir", str(resumed), *TRAIN)
    keys = ("train/lm_loss", "train/mtp_loss_1", "train/indexer_loss", "train/grad_norm")
    assert [[r[k] for k in keys] for r in metrics(resumed)[2:]] == [[r[k] for k in keys] for r in rows[2:]]


def test_export_loads_in_transformers_with_our_logits(dsa_run, tokens, tmp_path):
    ours = megatron_forward(dsa_run, tokens, tmp_path / "out.pt")
    export = export_to_hf(dsa_run, tmp_path / "hf", mtp="separate", dtype="fp32")
    model, info = transformers.DeepseekV32ForCausalLM.from_pretrained(
        export / "main", dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    assert model.config.index_topk == 16 < model.config.max_position_embeddings
    with torch.no_grad():
        logits = model.eval()(torch.load(tokens)).logits
    assert (logits - ours["logits"]).abs().max().item() < 1e-4
    mtp_names = set(hf_tensors(export / "mtp"))  # the MTP layer has its own indexer, as the release's layer 61
    assert {f"model.layers.3.self_attn.indexer.{n}" for n in
            ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias", "weights_proj.weight")} <= mtp_names


RANDOM = {  # the two DSA families' transformers classes, small; GLM-5's layer 1 reuses layer 0's top-k (IndexShare).
    # rms_norm_eps 1e-6: transformers' q/kv latent norms take 1e-6 whatever it says (megatron-core, vLLM and SGLang
    # take rms_norm_eps), so only at 1e-6 are the logits transformers' to 1e-4 (GLM-5's 1e-5: its serving note)
    "deepseek_v32": ("DeepseekV32Config", "DeepseekV32ForCausalLM", dict(n_group=2, topk_group=1, rms_norm_eps=1e-6)),
    "glm_moe_dsa": ("GlmMoeDsaConfig", "GlmMoeDsaForCausalLM",
                    dict(n_group=1, topk_group=1, rms_norm_eps=1e-6, index_topk_freq=2, index_skip_topk_offset=1)),
}


def _random_model(family: str, topk: int):
    config_class, model_class, own = RANDOM[family]
    cfg = getattr(transformers, config_class)(
        vocab_size=4096, hidden_size=64, intermediate_size=160, moe_intermediate_size=32, num_hidden_layers=3,
        first_k_dense_replace=1, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=32, kv_lora_rank=16,
        qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=8, n_shared_experts=1,
        num_experts_per_tok=2, routed_scaling_factor=2.5, index_n_heads=4, index_head_dim=16, index_topk=topk,
        max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        attn_implementation="eager", **own)
    torch.manual_seed(0)
    model = getattr(transformers, model_class)(cfg).eval()
    with torch.no_grad():  # weights that transformers initialises to constants get values of their own
        for name, param in model.named_parameters():
            if "norm" in name or "gate." in name:
                param.add_(torch.randn_like(param) * 0.1)
    return model


@pytest.mark.parametrize("family", list(RANDOM))
def test_transformers_built_model_imports_with_its_logits_and_exports_back(family, tokens, tmp_path):
    ids = torch.load(tokens)
    assert ids.shape[1] > 5
    model = _random_model(family, topk=5)
    with torch.no_grad():
        reference = model(ids).logits
        dense = _random_model(family, topk=ids.shape[1]).eval()(ids).logits
    assert (reference - dense).abs().max().item() > 1e-3  # the top-k is below the length: sparsity matters
    model.save_pretrained(tmp_path / "hf")
    ckpt = import_from_hf(tmp_path / "hf", tmp_path / "ckpt")
    ours = megatron_forward(ckpt, tokens, tmp_path / "out.pt")
    assert ours["mtp_logits"] == []
    assert (ours["logits"] - reference).abs().max().item() < 1e-4
    back = export_to_hf(ckpt, tmp_path / "back", mtp="none", dtype="fp32")
    a, b = hf_tensors(back), hf_tensors(tmp_path / "hf")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k].float()) for k in a)
    cfg = json.loads((back / "config.json").read_text())
    assert cfg["architectures"] == [RANDOM[family][1]] and cfg["model_type"] == family
    assert (cfg["index_n_heads"], cfg["index_head_dim"], cfg["index_topk"]) == (4, 16, 5)
    if family == "glm_moe_dsa":  # the shared layer has no indexer, in transformers' tensors and ours
        assert cfg["indexer_types"] == ["full", "shared", "full"] and (cfg["n_group"], cfg["topk_group"]) == (1, 1)
        assert not any(k.startswith("model.layers.1.self_attn.indexer.") for k in a)
        assert "model.layers.2.self_attn.indexer.wq_b.weight" in a
    again, info = getattr(transformers, RANDOM[family][1]).from_pretrained(
        back, dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"] and not info["mismatched_keys"]
    with torch.no_grad():
        assert torch.equal(again.eval()(ids).logits, reference)
