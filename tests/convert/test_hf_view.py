"""The typed view of an HF config.json: one parse for both rope spellings, round trip, MTP depth, YaRN defaults."""

import dataclasses
import math

import pytest

from megatron_mtp.config.model import MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_config import to_hf_config
from megatron_mtp.models.deepseek_v3.hf_view import mtp_depth, parse_hf_config
from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig as ModelConfig
from megatron_mtp.models.deepseek_v3.model_config import YarnConfig

from .test_hf_config import V3_RELEASE


def _transformers_spelling(release: dict) -> dict:
    """What transformers 5 writes back for the release config: rope_parameters holding rope_theta."""
    out = {k: v for k, v in release.items() if k not in ("rope_scaling", "rope_theta", "num_nextn_predict_layers")}
    out["rope_parameters"] = dict(release["rope_scaling"], rope_type="yarn", rope_theta=release["rope_theta"])
    out["num_mtp_layers"] = release["num_nextn_predict_layers"]
    return out


def test_both_rope_spellings_give_the_same_view():
    release = parse_hf_config(V3_RELEASE)
    assert release.rope_scaling is not None and release.rope_scaling.factor == 40 and release.rope_theta == 10000
    assert parse_hf_config(_transformers_spelling(V3_RELEASE)) == release


@pytest.mark.parametrize("yarn", [YarnConfig(), YarnConfig(factor=4.0, original_max_position_embeddings=512)])
def test_view_round_trips_through_to_dict(yarn):
    assert parse_hf_config(parse_hf_config(V3_RELEASE).to_dict()) == parse_hf_config(V3_RELEASE)
    for experts in (8, 0):
        model = ModelConfig(router_group_topk=1, num_experts=experts, yarn=yarn)
        view = to_hf_config(model, MTPConfig(num_layers=2), vocab_size=512, num_nextn_predict_layers=2, eos_token_id=1)
        assert parse_hf_config(view.to_dict()) == view
        assert dataclasses.replace(view, num_nextn_predict_layers=0).to_dict()["num_nextn_predict_layers"] == 0


def test_dense_model_writes_integer_expert_counts_that_transformers_accepts():
    view = to_hf_config(ModelConfig(num_experts=0, router_num_groups=None, router_group_topk=None), MTPConfig(),
                        vocab_size=64, num_nextn_predict_layers=0)
    written = view.to_dict()
    assert [written[k] for k in ("n_routed_experts", "n_shared_experts", "num_experts_per_tok")] == [0, 0, None]
    assert not any(view.is_moe_layer(i) for i in range(view.num_hidden_layers))
    assert parse_hf_config(written) == view
    transformers = pytest.importorskip("transformers")
    hf = transformers.DeepseekV3Config(**written)  # its strict config class refuses null expert counts
    assert (hf.n_routed_experts, hf.first_k_dense_replace) == (0, view.num_hidden_layers)


@pytest.mark.parametrize(
    "config, depth",
    [({"num_nextn_predict_layers": 2}, 2), ({"num_mtp_layers": 3}, 3), ({}, 0),
     ({"num_nextn_predict_layers": None}, 0)],
)
def test_mtp_depth_reads_either_spelling(config, depth):
    assert mtp_depth(config) == depth


def test_missing_and_malformed_fields_are_one_error():
    with pytest.raises(UserError, match="has no 'hidden_size'"):
        parse_hf_config({k: v for k, v in V3_RELEASE.items() if k != "hidden_size"})
    with pytest.raises(UserError, match="'num_hidden_layers' has a malformed value 'many'"):
        parse_hf_config(dict(V3_RELEASE, num_hidden_layers="many"))


def test_yarn_defaults_give_megatron_the_numbers_transformers_computes():
    """A yarn config.json without mscale/mscale_all_dim: transformers' attention factor and softmax scale
    equal megatron-core's with the view's defaults (mscale 1.0, mscale_all_dim 0.0)."""
    transformers = pytest.importorskip("transformers")
    from megatron.core.models.common.embeddings.yarn_rotary_pos_embedding import (
        _yarn_get_concentration_factor,
        _yarn_get_mscale,
    )
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import yarn_apply_mscale

    raw = dict(V3_RELEASE, rope_scaling={"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096})
    raw.pop("quantization_config")
    yarn = parse_hf_config(raw).rope_scaling
    assert (yarn.mscale, yarn.mscale_all_dim) == (1.0, 0.0)
    hf = transformers.DeepseekV3Config(**raw)
    _, hf_attention_factor = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu")
    assert _yarn_get_concentration_factor(yarn.factor, yarn.mscale, yarn.mscale_all_dim) == hf_attention_factor
    scale = 1 / math.sqrt(hf.qk_head_dim)
    megatron_scale = _yarn_get_mscale(yarn.factor, yarn.mscale_all_dim) ** 2 * scale
    assert yarn_apply_mscale(hf.rope_parameters, scale) == megatron_scale
