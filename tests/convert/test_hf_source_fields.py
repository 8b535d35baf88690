"""HF -> from-hf -> to-hf gives back the config.json and generation_config.json that came in, field by
field, except the differences listed (and justified) below."""

from __future__ import annotations

import json
import shutil

import pytest

from megatron_mtp.convert.from_hf import import_from_hf
from megatron_mtp.convert.to_hf import export_to_hf
from megatron_mtp.models.deepseek_v3.hf_config import NOT_CARRIED, carry_source_fields, to_hf_config
from megatron_mtp.models.deepseek_v3.hf_view import parse_hf_config

from .test_hf_config import V3_RELEASE

transformers = pytest.importorskip("transformers")

# Fields of the source that may differ in the export, and why.
ALLOWED = {
    "dtype": "written as torch_dtype (the release spelling); the export's --dtype sets it",
    "torch_dtype": "the export's --dtype sets it",
    "rope_parameters": "transformers' spelling; written as rope_scaling + rope_theta with the same values",
    "rope_scaling": "see rope_parameters",
    "rope_theta": "see rope_parameters",
    "transformers_version": "records who wrote the source file",
    "auto_map": "names remote-code files that are not exported",
}
SAMPLING = {"do_sample": True, "temperature": 0.6, "top_p": 0.95}


def _saved_by_transformers(export_fp32, tmp_path):
    """The tiny model as transformers 5 writes it (rope_parameters, head_dim, dtype, pad_token_id, ...),
    without a tokenizer (so special token ids are known only from config.json), plus fields a
    published model may have: a list of end-of-turn ids, a remote-code auto_map, sampling defaults."""
    model = transformers.AutoModelForCausalLM.from_pretrained(export_fp32 / "main")
    src = tmp_path / "src"
    model.save_pretrained(src)
    config = json.loads((src / "config.json").read_text())
    assert {"rope_parameters", "head_dim", "dtype", "pad_token_id"} <= config.keys()
    config.update(eos_token_id=[1, 2], ep_size=1, auto_map={"AutoConfig": "configuration_deepseek.DeepseekV3Config"})
    (src / "config.json").write_text(json.dumps(config))
    gen = dict(json.loads((src / "generation_config.json").read_text()), eos_token_id=[1, 2], **SAMPLING)
    (src / "generation_config.json").write_text(json.dumps(gen))
    return src, config, gen


def test_config_and_generation_config_come_back(export_fp32, tmp_path):
    src, config, gen = _saved_by_transformers(export_fp32, tmp_path)
    back = export_to_hf(import_from_hf(src, tmp_path / "ckpt"), tmp_path / "back", mtp="none", dtype="fp32")
    out = json.loads((back / "config.json").read_text())
    for key in sorted(config.keys() | out.keys()):
        if key not in ALLOWED:
            assert out.get(key, "<absent>") == config.get(key, "<absent>"), key
    assert (out["bos_token_id"], out["eos_token_id"], out["head_dim"]) == (0, [1, 2], config["head_dim"])
    assert out["torch_dtype"] == "float32" and "auto_map" not in out and "transformers_version" not in out
    assert parse_hf_config(out).rope_theta == parse_hf_config(config).rope_theta
    assert parse_hf_config(out).rope_scaling is None is parse_hf_config(config).rope_scaling
    got = json.loads((back / "generation_config.json").read_text())
    assert got == {k: v for k, v in gen.items() if k != "transformers_version"}
    transformers.AutoConfig.from_pretrained(back)  # the strict config class takes every field
    assert transformers.GenerationConfig.from_pretrained(back).eos_token_id == [1, 2]


def test_the_tokenizer_decides_ids_it_names(export_fp32, tmp_path):
    src, config, _ = _saved_by_transformers(export_fp32, tmp_path)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(export_fp32 / "main" / name, src / name)  # names <|end_of_text|> = id 1 as EOS
    ckpt = import_from_hf(src, tmp_path / "ckpt")
    out = json.loads((export_to_hf(ckpt, tmp_path / "back", mtp="none") / "config.json").read_text())
    assert out["eos_token_id"] == [1, 2]  # the stored list holds the tokenizer's id: it stays
    config["eos_token_id"] = 7
    (ckpt / "hf_source" / "config.json").write_text(json.dumps(config))
    out = json.loads((export_to_hf(ckpt, tmp_path / "again", mtp="none") / "config.json").read_text())
    assert out["eos_token_id"] == 1  # a different stored id: the tokenizer's wins


def _ours():
    from megatron_mtp.models.deepseek_v3.hf_config import from_hf_config

    model, mtp, vocab = from_hf_config(V3_RELEASE)
    return to_hf_config(model, mtp, vocab_size=vocab, num_nextn_predict_layers=1).to_dict()


NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


def test_release_fields_that_no_longer_hold_are_not_carried():
    out = carry_source_fields(_ours(), V3_RELEASE, NO_IDS)
    assert "quantization_config" not in out and "quantization_config" in NOT_CARRIED  # weights were dequantized
    assert out["rope_scaling"] == V3_RELEASE["rope_scaling"]  # the release spelling, as it came in
    assert (out["bos_token_id"], out["eos_token_id"]) == (0, 1)
    changed = dict(V3_RELEASE, num_hidden_layers=60, head_dim=64)  # describes another model: nothing is carried
    out = carry_source_fields(_ours(), changed, NO_IDS)
    assert "head_dim" not in out and out["bos_token_id"] is None


def test_a_null_never_replaces_a_written_integer():
    from megatron_mtp.config.model import MTPConfig
    from megatron_mtp.models.deepseek_v3.model_config import DeepseekV3ModelConfig as ModelConfig

    dense = ModelConfig(num_experts=0, router_num_groups=None, router_group_topk=None)
    ours = to_hf_config(dense, MTPConfig(), vocab_size=64, num_nextn_predict_layers=0).to_dict()
    older = dict(ours, n_routed_experts=None, n_shared_experts=None)  # what dense exports used to write
    out = carry_source_fields(ours, older, NO_IDS)
    assert (out["n_routed_experts"], out["n_shared_experts"]) == (0, 0)
    transformers.DeepseekV3Config(**out)
