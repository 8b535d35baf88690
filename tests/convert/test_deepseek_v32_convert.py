"""The DSA families against transformers. DeepSeek-V3.2 (model.family deepseek_v32): one short run (4 steps, one
process) logs the indexer's KL loss (per layer, the MTP layer's apart) and the MTP acceptance at every step, resumes
exactly from its step-2 checkpoint, and exports a directory that transformers' DeepseekV32ForCausalLM loads with no
missing or unexpected key and our logits. Both families (deepseek_v32, and GLM-5's glm_moe_dsa:
GlmMoeDsaForCausalLM): a random model transformers built (MLA with the lightning indexer, a dense first layer,
sigmoid routing; index_topk below the sequence length, so the indexer decides what each query reads; GLM-5 with one
routing group and IndexShare, its layer 1 reusing layer 0's top-k without an indexer of its own) imports with its
logits and exports back to its own tensors bitwise, which transformers' class loads with no missing or unexpected
key. The training recipe of the DeepSeek-V3.2 report on a tiny DeepSeek-V3 run: its checkpoint grows fresh indexers,
a dense warm-up trains them alone (every other weight stays bitwise the checkpoint's, the indexer loss falls), then a
sparse stage trains everything; MTP logs its acceptance in both. Needs megatron-core 0.19 (its DSA modules build the
model)."""

from __future__ import annotations

import json

import pytest
import torch

from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.models.dsa.stages import dense_checkpoint_key, is_indexer
from megatron_mtp.platform.megatron_core import is_019
from tests.convert.conftest import TRAIN_OVERRIDES, megatron_forward
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


# The recipe (README.md, "Training DeepSeek-V3.2 as its report does") on the tiny DeepSeek-V3 run the conversion tests
# share (conftest.trained_run: tiny_cpu.yaml, 4 layers and an MTP layer): the same shape with a 4-head indexer.
V3 = ["configs/tiny_cpu.yaml", *TRAIN_OVERRIDES, "logging.log_interval=1"]
V32 = [*V3, "model.family=deepseek_v32", "model.index_n_heads=4", "model.index_head_dim=32", "model.index_topk=16",
       "model.indexer_loss_coeff=0.01", "checkpoint.load_optimizer=false"]


@pytest.fixture(scope="module")
def stages(trained_run, tmp_path_factory):
    """The V3 run -> a 4-step dense warm-up (checkpoints at steps 3 and 4) -> a 2-step sparse stage; beside them, a
    step of the V3 model itself on the stages' first batch (their dense reference)."""
    root = tmp_path_factory.mktemp("dsa_stages")
    warmup, sparse, dense = root / "warmup", root / "sparse", root / "v3_step"
    megatron_cli("train", "--run-dir", str(dense), *V3, "--max-steps", "1",
                 f"checkpoint.load={trained_run}", "checkpoint.load_optimizer=false")
    megatron_cli("train", "--run-dir", str(warmup), *V32, "--max-steps", "4", "model.dsa_stage=warmup",
                 f"checkpoint.load={trained_run}", "checkpoint.save_interval=3", "optimizer.lr=1e-3",
                 "schedule.warmup_steps=0", "schedule.decay_style=constant")
    megatron_cli("train", "--run-dir", str(sparse), *V32, "--max-steps", "2", "model.dsa_stage=sparse",
                 f"checkpoint.load={warmup}")
    return warmup, sparse, dense


def _steps(run):
    return sorted((run / "checkpoints").glob("step_*"))


def test_the_dense_warmup_trains_the_indexers_alone_then_the_sparse_stage_trains_everything(trained_run, stages):
    warmup, sparse, dense = stages
    (v3,), (third, last), (sparse_last,) = _steps(trained_run), _steps(warmup), _steps(sparse)
    with TorchDistReader(v3) as src, TorchDistReader(third) as mid, TorchDistReader(last) as end:
        weights = [k for k in end.keys() if not k.startswith("optimizer")]
        indexers = [k for k in weights if is_indexer(k)]
        main = [k for k in weights if not is_indexer(k)]
        # every tensor but the indexers' (5 each: 4 decoder layers and the MTP layer's) is the V3 checkpoint's
        assert len(indexers) == 5 * 5 and any(k.startswith("mtp.") for k in indexers)
        assert sorted(dense_checkpoint_key(k) for k in main) == sorted(k for k in src.keys()
                                                                       if not k.startswith("optimizer"))
        assert any(k.endswith("expert_bias") for k in main)  # the routers' biases are held too
        loaded = {k: src.read(dense_checkpoint_key(k)) for k in main}
        for step in (mid, end):  # bitwise, at both of the warm-up's checkpoints
            changed = [k for k in main if not torch.equal(loaded[k], step.read(k))]
            assert not changed, changed[:5]
        assert all(not torch.equal(mid.read(k), end.read(k)) for k in indexers)  # every indexer learns
    rows = metrics(warmup)
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    falls = [r["train/indexer_loss"] for r in rows]
    assert falls[-1] < 0.9 * falls[0], falls  # the indexers' KL towards the (dense) attention falls
    assert all(0.0 < r["train/indexer_loss/layer_05"] for r in rows)  # the MTP layer's indexer's too
    # the first step of each reads the same batch with V3's weights: the warm-up's attention is dense (every earlier
    # token of 32, whatever model.index_topk says), so its losses are V3's own; the sparse stage's top-16 are not
    (v3,), first = metrics(dense), metrics(sparse)[0]
    for key in ("train/lm_loss", "train/mtp_loss_1"):
        assert rows[0][key] == pytest.approx(v3[key], rel=1e-5, abs=0.0)
        assert first[key] != pytest.approx(v3[key], rel=1e-5, abs=0.0)
    for r in rows + metrics(sparse):  # MTP works in both stages, its acceptance logged
        assert 0.0 <= r["train/mtp_acceptance_1"] <= 1.0 and r["train/mtp_loss_1"] > 0.0
        assert r["train/indexer_loss"] > 0.0
    with TorchDistReader(last) as before, TorchDistReader(sparse_last) as after:
        moved = [k for k in main if not torch.equal(before.read(k), after.read(k))]
        assert any("linear_q_down_proj" in k for k in moved) and any("experts" in k for k in moved)


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
