"""The Qwen3-MoE family's config side: its MoE-layer rule (decoder_sparse_step, mlp_only_layers) is
transformers' and drives megatron-core's layer pattern; the shipped configs are the releases' shapes
(their config.json, as published, reads to the same model); its own checks are one sentence each."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import mtp_is_moe

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "qwen3_moe_tiny_cpu.yaml")

RELEASE_30B = {  # Qwen/Qwen3-30B-A3B config.json as published
    "architectures": ["Qwen3MoeForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "decoder_sparse_step": 1, "eos_token_id": 151645, "head_dim": 128,
    "hidden_act": "silu", "hidden_size": 2048, "initializer_range": 0.02, "intermediate_size": 6144,
    "max_position_embeddings": 40960, "max_window_layers": 48, "mlp_only_layers": [], "model_type": "qwen3_moe",
    "moe_intermediate_size": 768, "norm_topk_prob": True, "num_attention_heads": 32, "num_experts": 128,
    "num_experts_per_tok": 8, "num_hidden_layers": 48, "num_key_value_heads": 4, "output_router_logits": False,
    "rms_norm_eps": 1e-06, "rope_scaling": None, "rope_theta": 1000000.0, "router_aux_loss_coef": 0.001,
    "sliding_window": None, "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.51.0", "use_cache": True, "use_sliding_window": False, "vocab_size": 151936,
}
RELEASE_235B = {**RELEASE_30B, "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 94,
                "num_attention_heads": 64, "moe_intermediate_size": 1536, "max_window_layers": 94}
"""Qwen/Qwen3-235B-A22B's differs from the 30B's in these fields."""
TRAINING_ONLY = ("make_vocab_size_divisible_by", "aux_loss_type", "init_method_std", "router_bias_update_rate")


@pytest.mark.parametrize(("config", "release"), [("qwen3_30b_a3b", RELEASE_30B), ("qwen3_235b_a22b", RELEASE_235B)])
def test_shipped_configs_are_the_releases(config, release):
    ours = load_config(str(ROOT / "configs" / f"{config}.yaml")).model
    theirs, mtp, vocab = get_family("qwen3_moe").from_hf_config(json.loads(json.dumps(release)))
    assert mtp.num_layers == 0 and vocab == ours.vocab_size
    differ = [f.name for f in dataclasses.fields(ours)
              if f.name not in TRAINING_ONLY and getattr(ours, f.name) != getattr(theirs, f.name)]
    assert differ == [], [(k, getattr(ours, k), getattr(theirs, k)) for k in differ]


def test_moe_layer_rule_is_transformers_and_megatron_cores():
    transformers = pytest.importorskip("transformers")
    from megatron_mtp.models.megatron_config import moe_layer_pattern

    for step, dense in ((1, []), (2, []), (3, [2, 7]), (2, [0, 1, 5])):
        cfg = load_config(TINY, ["model.num_layers=9", f"model.decoder_sparse_step={step}",
                                 f"model.mlp_only_layers={dense}"])
        hf = transformers.Qwen3MoeConfig(num_hidden_layers=9, decoder_sparse_step=step, mlp_only_layers=dense,
                                         num_experts=8)
        want = [int(i not in hf.mlp_only_layers and (i + 1) % hf.decoder_sparse_step == 0) for i in range(9)]
        assert moe_layer_pattern(cfg) == want, (step, dense)
        raw = get_family("qwen3_moe").to_hf_config(cfg.model, cfg.mtp, vocab_size=64,
                                                   num_nextn_predict_layers=0).to_dict()
        view = get_family("qwen3_moe").hf_view(raw, "config.json")
        assert [int(view.is_moe_layer(i)) for i in range(9)] == want
    first = load_config(TINY, ["model.num_layers=6", "model.first_k_dense=2", "model.mlp_only_layers=[3]"])
    raw = get_family("qwen3_moe").to_hf_config(first.model, first.mtp, vocab_size=64,
                                               num_nextn_predict_layers=0).to_dict()
    assert raw["mlp_only_layers"] == [0, 1, 3]  # first_k_dense has no Qwen spelling
    # layer 0 is dense there, so SGLang builds the MTP layer dense, and so does training: it exports
    assert not mtp_is_moe(first.model)
    raw = get_family("qwen3_moe").to_hf_config(first.model, first.mtp, vocab_size=64,
                                               num_nextn_predict_layers=1).to_dict()
    assert not get_family("qwen3_moe").hf_view(raw, "config.json").is_moe_layer(6)


@pytest.mark.parametrize(("override", "words"), [
    ("model.decoder_sparse_step=0", "model.decoder_sparse_step is 0; it must be a positive integer"),
    ("model.mlp_only_layers=[4]", "model.mlp_only_layers names layer 4, but the model's layers are 0 to 3"),
    ("model.mlp_only_layers=[1,1]", r"model.mlp_only_layers \[1, 1\] names a layer twice"),
    ("model.num_query_groups=3", "model.num_query_groups=3 must be positive and divide"),
    ("model.rotary_percent=0.5", "model.rotary_percent is a field of model.family=glm4_moe, not of "
                                 "model.family=qwen3_moe"),
    ("model.add_qkv_bias=true", "model.add_qkv_bias is a field of model.family=glm4_moe"),
])
def test_bad_qwen3_fields_are_one_sentence(override, words):
    with pytest.raises(UserError, match=words) as err:
        validate(load_config(TINY, [override]))
    assert str(err.value).count(". ") == 0


def test_the_mtp_layer_is_trained_as_sglang_builds_it_so_every_such_model_exports():
    """SGLang's Qwen3-MoE draft builds its one layer as layer 0 of the rule; training builds the MTP layer
    by the same index (not like the last decoder layer), in the tensor table and in megatron-core's spec."""
    for overrides, moe in ((["model.decoder_sparse_step=2"], False),  # layer 0 dense, the last layer MoE
                           (["model.mlp_only_layers=[0]"], False), ([], True),
                           (["model.num_layers=4", "model.mlp_only_layers=[3]"], True)):  # the last one dense
        cfg = load_config(TINY, overrides)
        assert mtp_is_moe(cfg.model) is moe, overrides
        raw = get_family("qwen3_moe").to_hf_config(cfg.model, cfg.mtp, vocab_size=64,
                                                   num_nextn_predict_layers=1).to_dict()
        view = get_family("qwen3_moe").hf_view(raw, "config.json")
        assert view.is_moe_layer(cfg.model.num_layers) is moe and (0 in view.moe_layers) is moe
        experts = [p for p in get_family("qwen3_moe").table.param_table(cfg.model, 1)
                   if p.mcore.startswith("mtp.") and "experts" in p.mcore]
        assert bool(experts) is moe, overrides
