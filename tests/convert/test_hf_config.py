"""Config translation both ways: lossless round trip, and an error for every unrepresentable field."""

import dataclasses

import pytest

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_config import from_hf_config, to_hf_config
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig as ModelConfig
from megatron_mtp.models.deepseek_v3.model_config import YarnConfig

V3_RELEASE = {
    "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": 129280,
    "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048, "num_hidden_layers": 61,
    "num_nextn_predict_layers": 1, "num_attention_heads": 128, "num_key_value_heads": 128, "q_lora_rank": 1536,
    "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
    "first_k_dense_replace": 3, "moe_layer_freq": 1, "n_routed_experts": 256, "n_shared_experts": 1,
    "num_experts_per_tok": 8, "n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5,
    "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True, "rms_norm_eps": 1e-6,
    "rope_theta": 10000, "max_position_embeddings": 163840, "tie_word_embeddings": False,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096, "beta_fast": 32,
                     "beta_slow": 1, "mscale": 1.0, "mscale_all_dim": 1.0},
    "bos_token_id": 0, "eos_token_id": 1, "torch_dtype": "bfloat16", "hidden_act": "silu",
    "quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                            "weight_block_size": [128, 128]},
}


def test_release_config_translates_and_round_trips():
    model, mtp, vocab = from_hf_config(V3_RELEASE)
    assert (model.num_layers, model.num_experts, model.first_k_dense, mtp.num_layers) == (61, 256, 3, 1)
    assert (model.router_num_groups, model.router_group_topk, model.router_topk) == (8, 4, 8)
    assert model.yarn.factor == 40 and model.router_enable_expert_bias and vocab == 129280
    back = to_hf_config(model, mtp, vocab_size=vocab, num_nextn_predict_layers=1).to_dict()
    for key, value in V3_RELEASE.items():
        if key in ("quantization_config", "bos_token_id", "eos_token_id"):
            continue
        if key == "rope_scaling":
            assert {k: back[key][k] for k in value} == value
        else:
            assert back[key] == value, key


def test_our_config_round_trips():
    model = ModelConfig(num_layers=3, router_num_groups=2, router_group_topk=1, router_topk=2,
                        yarn=YarnConfig(factor=4.0, original_max_position_embeddings=512, mscale=0.7), vocab_size=512)
    hf = to_hf_config(model, MTPConfig(num_layers=2), vocab_size=512, num_nextn_predict_layers=2).to_dict()
    back, mtp, vocab = from_hf_config(hf)
    ignore = {"make_vocab_size_divisible_by", "router_bias_update_rate", "aux_loss_coeff"}
    for f in dataclasses.fields(ModelConfig):
        if f.name not in ignore:
            assert getattr(back, f.name) == getattr(model, f.name), f.name
    assert mtp.num_layers == 2 and vocab == 512


def test_transformers_reads_our_config():
    transformers = pytest.importorskip("transformers")
    model = ModelConfig(router_group_topk=1)
    hf = to_hf_config(model, MTPConfig(), vocab_size=256, num_nextn_predict_layers=0).to_dict()
    cfg = transformers.DeepseekV3Config(**hf)
    assert cfg.n_group == 4 and cfg.topk_group == 1 and cfg.qk_rope_head_dim == 16 and cfg.num_hidden_layers == 4


@pytest.mark.parametrize(
    "change, field",
    [
        ({"moe_layer_freq": 2}, "moe_layer_freq"),
        ({"hidden_act": "gelu"}, "hidden_act"),
        ({"rope_interleave": False}, "rope_interleave"),
        ({"num_key_value_heads": 1}, "num_key_value_heads"),
        ({"some_new_field": 3}, "some_new_field"),
        ({"rope_scaling": {"type": "linear", "factor": 2}}, "linear"),
        ({"topk_method": "mystery"}, "topk_method"),
        ({"num_experts_per_tok": 4}, "router_group_topk"),
        ({"architectures": ["LlamaForCausalLM"]}, "architectures"),
    ],
)
def test_unrepresentable_hf_fields_are_errors(change, field):
    with pytest.raises(UserError, match=field):
        from_hf_config(dict(V3_RELEASE, **change))


def test_unrepresentable_model_fields_are_errors():
    with pytest.raises(UserError, match="router_group_topk"):
        to_hf_config(ModelConfig(router_num_groups=4, router_group_topk=2, router_topk=2), MTPConfig(),
                     vocab_size=64, num_nextn_predict_layers=0)
    with pytest.raises(UserError, match="router_enable_expert_bias"):
        to_hf_config(ModelConfig(router_enable_expert_bias=False, router_group_topk=1), MTPConfig(),
                     vocab_size=64, num_nextn_predict_layers=0)


def test_all_dense_decoder_layers_beside_routed_experts_still_get_a_moe_mtp_layer():
    """All decoder layers dense (first_k_dense = num_layers): the engines build the MTP layer at index
    num_layers, MoE from first_k_dense_replace on, and training builds it so too; it exports."""
    from megatron_mtp.models.tensor_table import mtp_is_moe

    model = ModelConfig(num_layers=1, first_k_dense=1, router_group_topk=1)
    assert mtp_is_moe(model)
    assert to_hf_config(model, MTPConfig(num_layers=1), vocab_size=64,
                        num_nextn_predict_layers=1).first_k_dense_replace == 1
