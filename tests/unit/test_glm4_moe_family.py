"""GLM-4.5 (model.family glm4_moe): its config fields, their checks, its tensor table and config.json."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import family_of_hf_config, get_family
from megatron_mtp.models.glm4_moe.hf_config import carry_source_fields, from_hf_config, to_hf_config

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml")
NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


@pytest.mark.parametrize("override, words", [
    (("model.num_query_groups=3",), "must be positive and divide model.num_attention_heads=4"),
    (("parallel.tensor=4", "parallel.expert_tensor=1", "parallel.world_size=4"), "not divisible by parallel.tensor=4"),
    (("model.rotary_percent=0.3",), "rotate an even number"),
    (("model.head_dim=null", "model.hidden_size=130"), "set model.head_dim"),
    (("recompute.granularity=selective", "recompute.modules=[mla_up_proj]"),
     "recomputes MLA's up-projections, which model.family=glm4_moe does not have"),
    (("mtp.style=parallel",), "mtp.style=parallel is not built for model.family=glm4_moe"),
    (("model.yarn.factor=4",), "model.yarn is a field of model.family=deepseek_v3 or model.family=deepseek_v32 or "
                               "model.family=glm_moe_dsa, "
                               "not of model.family=glm4_moe"),
    (("model.num_query_groups=0",), "model.num_query_groups is 0; set a positive number, or null for one key/value"),
    (("model.head_dim=-48",), r"model.head_dim is -48; set a positive number, or null for model.hidden_size /"),
    (("model.head_dim=0",), "model.head_dim is 0; set a positive number"),
])
def test_bad_glm_settings_are_one_sentence(override, words):
    from megatron_mtp.config.validate import validate

    with pytest.raises(UserError, match=words) as err:
        validate(load_config(TINY, list(override)))
    assert str(err.value).count(". ") == 0


def test_gqa_fields_are_refused_for_mla():
    from megatron_mtp.config.validate import validate

    validate(load_config(None))
    both = "glm4_moe or model.family=qwen3_moe"  # Qwen3-MoE's grouped-query fields have GLM's names
    all3 = "gemma4 or model.family=" + both  # Gemma 4's sliding layers' widths too (owners by name)
    for field, owners in (("model.num_query_groups=2", all3), ("model.head_dim=64", all3),
                          ("model.qk_layernorm=true", both), ("model.add_qkv_bias=true", "glm4_moe"),
                          ("model.rotary_percent=0.5", "glm4_moe")):
        first = owners.split(" ")[0]
        with pytest.raises(UserError, match=f"^{field.split('=')[0]} is a field of model.family={owners}, not of "
                                            f"model.family=deepseek_v3; remove it or set model.family={first}$"):
            validate(load_config(None, [field]))


def test_tensor_table_fuses_qkv_per_group_both_ways():
    cfg = load_config(TINY)
    table = get_family("glm4_moe").param_table(cfg.model, 1, spec="te")
    qkv = next(p for p in table if p.mcore == "decoder.layers.0.self_attention.linear_qkv.weight")
    assert qkv.qkv == (2, 2, 48) and qkv.part_rows(384) == [192, 96, 96]
    # megatron-core's rows: [group 0: q heads 0 and 1, k head 0, v head 0; group 1: q 2 and 3, k 1, v 1]
    rows = torch.arange(8).repeat_interleave(48)[:, None].float()
    q, k, v = qkv.split(rows)
    assert q[::48, 0].tolist() == [0, 1, 4, 5] and k[::48, 0].tolist() == [2, 6] and v[::48, 0].tolist() == [3, 7]
    assert torch.equal(qkv.join([q, k, v]), rows)
    names = {n for p in table for n in p.hf_names()}
    assert {"model.layers.4.self_attn.q_proj.bias", "model.layers.4.self_attn.k_norm.weight",
            "model.layers.4.eh_proj.weight", "model.layers.3.mlp.gate.e_score_correction_bias"} <= names
    plain = load_config(TINY, ["model.qk_layernorm=false", "model.add_qkv_bias=false"])
    names = {n for p in get_family("glm4_moe").param_table(plain.model, 0) for n in p.hf_names()}
    assert not any(n.endswith(("_proj.bias", "q_norm.weight")) for n in names)


def test_config_json_both_ways_and_its_family():
    cfg = load_config(TINY)
    written = to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1).to_dict()
    assert family_of_hf_config(written) is get_family("glm4_moe")
    assert family_of_hf_config({"model_type": "deepseek_v3"}) is get_family("deepseek_v3")
    model, mtp, vocab = from_hf_config(written)
    assert (vocab, mtp.num_layers) == (4096, 1)
    for field in ("family", "num_layers", "hidden_size", "num_attention_heads", "num_query_groups", "head_dim",
                  "rotary_percent", "qk_layernorm", "add_qkv_bias", "num_experts", "first_k_dense", "router_topk",
                  "router_num_groups", "router_group_topk", "router_topk_scaling_factor", "norm_epsilon"):
        assert getattr(model, field) == getattr(cfg.model, field), field
    # transformers 5's spelling reads the same
    modern = {k: v for k, v in written.items() if k not in ("rope_theta", "partial_rotary_factor", "rope_scaling",
                                                             "num_nextn_predict_layers")}
    modern.update(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5},
                  num_mtp_layers=1)
    assert from_hf_config(modern)[:2] == (model, mtp)
    # what an imported file said and still holds is written back; a different model's is not
    source = dict(written, pad_token_id=7, rope_parameters=modern["rope_parameters"])
    assert carry_source_fields(written, source, NO_IDS)["pad_token_id"] == 7
    assert "pad_token_id" not in carry_source_fields(written, dict(source, hidden_size=64), NO_IDS)


@pytest.mark.parametrize("change, words", [
    ({"hidden_act": "gelu"}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope type 'yarn'"),
    ({"sliding_window": 4096}, "'sliding_window' is not understood"),
    ({"architectures": ["LlamaForCausalLM"]}, "is not Glm4MoeForCausalLM"),
    ({"n_group": 2, "topk_group": 1, "num_experts_per_tok": 3}, "router_topk/router_group_topk"),
])
def test_what_glm_config_json_cannot_represent_is_refused(change, words):
    cfg = load_config(TINY)
    written = to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1).to_dict()
    with pytest.raises(UserError, match=words):
        from_hf_config({**written, **change})


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_heads": 2.5}, "field 'num_key_value_heads' has a malformed value 2.5; it must be an integer"),
    ({"use_qk_norm": "false"}, "field 'use_qk_norm' has a malformed value 'false'; it must be true or false"),
    ({"num_hidden_layers": -1}, "field 'num_hidden_layers' is -1; it must be a positive integer"),
    ({"hidden_size": True}, "field 'hidden_size' has a malformed value True; it must be an integer"),
    ({"rms_norm_eps": "1e-5"}, "field 'rms_norm_eps' has a malformed value '1e-5'; it must be a number"),
    ({"num_key_value_heads": None, "num_attention_heads": 4},
     r"num_key_value_heads \(not in the file; transformers' default 8\)"),
])
def test_glm_config_json_values_of_the_wrong_kind_are_one_sentence(change, words):
    cfg = load_config(TINY)
    written = to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1).to_dict()
    with pytest.raises(UserError, match=words) as err:
        from_hf_config({**written, **change})
    assert "\n" not in str(err.value)
    assert from_hf_config({**written, "num_key_value_heads": 2.0})[0].num_query_groups == 2  # an integral number


def test_two_rotary_settings_that_disagree_are_named_in_one_note(capsys):
    cfg = load_config(TINY)
    raw = to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1).to_dict()
    raw.update(rope_theta=10000.0, rope_parameters={"rope_type": "default", "rope_theta": 50000.0,
                                                     "partial_rotary_factor": raw["partial_rotary_factor"]})
    assert from_hf_config(raw)[0].rope_theta == 50000.0
    from_hf_config(raw)  # read again: noted once
    notes = [line for line in capsys.readouterr().err.splitlines() if line.startswith("note:")]
    assert notes == ["note: config.json: rope_parameters gives rope_theta 50000.0 and the top level 10000.0; "
                     "50000.0 is used, as transformers does"], notes


def test_glm_release_shapes_match_their_published_sizes():
    """355B total / 32B active and 106B / 12B (the release's names: MTP layers aside, the active count
    without the embedding and output layer)."""
    for name, total, active in (("glm4_5", 355e9, 32e9), ("glm4_5_air", 106e9, 12e9)):
        cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"))
        counts = get_family("glm4_moe").parameter_counts(cfg, 151552)
        embeddings = 2 * 151552 * cfg.model.hidden_size
        assert abs(counts["main"] / total - 1) < 0.02, (name, counts)
        assert abs((counts["main_active"] - embeddings) / active - 1) < 0.02, (name, counts)


def test_converter_and_decoder_read_a_config_json_alike():
    """One reader: where a file spells the rotary settings twice (top level and transformers 5's
    rope_parameters), the importer and the decoder take the same values, transformers' (rope_parameters)."""
    from megatron_mtp.models.glm4_moe.hf_config_json import parse_hf_config

    cfg = load_config(TINY)
    raw = to_hf_config(cfg.model, cfg.mtp, vocab_size=4096, num_nextn_predict_layers=1).to_dict()
    raw["rope_parameters"] = {"rope_type": "default", "rope_theta": 50000.0, "partial_rotary_factor": 0.25}
    model, _, _ = from_hf_config(raw)
    view = parse_hf_config(raw)
    assert (model.rope_theta, model.rotary_percent) == (view.rope_theta, view.partial_rotary_factor) == (50000.0, 0.25)


@pytest.mark.parametrize("change", ["model.rotary_percent=1.0", "model.qk_layernorm=false", "model.num_query_groups=1",
                                    "model.head_dim=64", "model.add_qkv_bias=false"])
def test_resume_refuses_a_change_of_the_attention_fields(change, tmp_path):
    from megatron_mtp.checkpoint.resume_rules import refuse_meaning_changes

    saved, now = load_config(TINY), load_config(TINY, [change])
    refuse_meaning_changes(saved, saved, tmp_path / "step_0000003", tmp_path)
    with pytest.raises(UserError, match=change.split("=")[0]):
        refuse_meaning_changes(saved, now, tmp_path / "step_0000003", tmp_path)
