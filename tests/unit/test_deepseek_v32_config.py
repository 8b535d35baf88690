"""The DSA families' run configs (model.family deepseek_v32 and glm_moe_dsa): their tiny configs load where
megatron-core 0.19's DSA modules are installed and are refused in one sentence naming 0.19 where they are not
(0.16); the indexer's fields and GLM-5's IndexShare are checked; a GLM-5 config.json's IndexShare reads as
transformers derives it, and what megatron-core cannot build is one sentence."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.platform.megatron_core import is_019

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
CONFIG = str(CONFIGS / "deepseek_v32_tiny_cpu.yaml")
GLM5 = str(CONFIGS / "glm_moe_dsa_tiny_cpu.yaml")
needs_019 = pytest.mark.skipif(not is_019(), reason="the DSA families need megatron-core 0.19's DSA modules")


@pytest.mark.parametrize("config, title", [(CONFIG, "DeepseekV32"), (GLM5, "GlmMoeDsa")])
def test_the_tiny_config_needs_megatron_core_019(config, title):
    if is_019():
        cfg = load_config(config)
        validate(cfg, world_size=1)
        assert type(cfg.model).__name__ == f"{title}ModelConfig"
        assert cfg.model.index_topk < cfg.training.seq_length  # the sparsity matters
    else:
        with pytest.raises(UserError, match=r"needs megatron-core 0\.19.*has megatron-core 0\.16"):
            validate(load_config(config), world_size=1)


@needs_019
@pytest.mark.parametrize("config, override, message", [
    (CONFIG, "model.index_head_dim=8", r"model.index_head_dim \(8\) is below model.qk_pos_emb_head_dim \(16\)"),
    (CONFIG, "model.index_topk=0", r"model.index_topk is 0; it must be positive"),
    (CONFIG, "model.q_lora_rank=null", r"model.q_lora_rank is null; DeepSeek-V3.2's indexer reads the query latent"),
    (CONFIG, "parallel.tensor=2 model.num_experts=0 parallel.sequence_parallel=false",
     r"parallel.sequence_parallel is false, but DeepSeek-V3.2's absorbed attention splits the sequence"),
    (GLM5, "model.q_lora_rank=null", r"model.q_lora_rank is null; GLM-5's indexer reads the query latent"),
    (GLM5, "model.index_topk_freq=0", r"model.index_topk_freq is 0; it must be 1 \(every layer runs its own"),
    (GLM5, "model.index_skip_topk_offset=0", r"model.index_skip_topk_offset is 0; it must be 1 or more, since the "
                                             r"first layer has no earlier top-k"),
    (GLM5, "parallel.pipeline=3", r"pipeline rank 1 starts on decoder layer 1, which reuses an earlier layer's "
                                  r"top-k \(model.index_topk_freq 2\); give parallel.pipeline_layout stages"),
])
def test_indexer_fields_are_checked(config, override, message):
    overrides = override.split() + (["parallel.pipeline_layout=Et|t|tmL"] if "pipeline=" in override else [])
    world = 2 if override.startswith("parallel.tensor") else 3 if "pipeline=" in override else 1
    with pytest.raises(UserError, match=message) as err:
        validate(load_config(config, overrides), world_size=world)
    assert str(err.value).count(". ") == 0


@needs_019
def test_glm5_index_share_is_transformers_and_megatron_cores():
    """Which layers run their own indexer: transformers' rule over 0-based layers, megatron-core's over its 1-based
    numbers (the MTP layers numbering their own), for a frequency and offset alike."""
    from megatron.core.transformer.experimental_attention_variant import dsa

    from megatron_mtp.models.glm_moe_dsa.hf_view import index_share_of, share_types

    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GlmMoeDsaConfig"):
        pytest.skip("this transformers has no GLM-5")
    cfg = load_config(GLM5)
    for layers, freq, offset in ((3, 2, 1), (8, 3, 2), (6, 1, 2), (7, 4, 3), (4, 5, 1)):
        theirs = transformers.GlmMoeDsaConfig(num_hidden_layers=layers, index_topk_freq=freq,
                                              index_skip_topk_offset=offset).indexer_types
        assert share_types(freq, offset, layers) == theirs
        assert ["full" if not dsa.is_dsa_skip_topk_layer(i + 1, offset, freq) or freq == 1 else "shared"
                for i in range(layers)] == theirs
        assert share_types(*index_share_of(theirs, "config.json"), layers) == theirs
        cfg.model.num_layers, cfg.model.index_topk_freq, cfg.model.index_skip_topk_offset = layers, freq, offset
        assert cfg.model.indexer_types() == theirs


@pytest.mark.parametrize("change, message", [
    ({"indexer_types": ["shared", "full", "full"]}, r"does not start with 'full'; the first layer has no earlier"),
    ({"indexer_types": ["full", "shared", "shared", "full", "full"], "num_hidden_layers": 5},
     r"is not one layer in index_topk_freq running its indexer after the first index_skip_topk_offset layers"),
    ({"index_topk_pattern": "FSX"}, r"index_topk_pattern 'FSX' holds letters other than F and S"),
    ({"indexer_types": ["full", "shared"]}, r"indexer_types has 2 entries for 3 layers \(num_hidden_layers\)"),
    ({"indexer_rope_interleave": False}, r"indexer_rope_interleave is false; GLM-5's indexer rotates interleaved"),
])
def test_a_glm5_config_json_megatron_core_cannot_build_is_one_sentence(change, message):
    from megatron_mtp.models.glm_moe_dsa.hf_view import parse_hf_config

    with pytest.raises(UserError, match=message) as err:
        parse_hf_config({"model_type": "glm_moe_dsa", "num_hidden_layers": 3, **change})
    assert str(err.value).count(". ") == 0


def test_glm5_config_json_reads_what_it_leaves_out_as_transformers_does():
    """A field a GLM-5 config.json leaves out is transformers' GlmMoeDsaConfig default; the IndexShare pattern of a
    pattern string, or of a frequency and offset, is the list transformers derives."""
    from megatron_mtp.models.glm_moe_dsa.hf_view import TRANSFORMERS_DEFAULTS, parse_hf_config

    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GlmMoeDsaConfig"):
        pytest.skip("this transformers has no GLM-5")
    theirs = transformers.GlmMoeDsaConfig()
    assert TRANSFORMERS_DEFAULTS == {k: getattr(theirs, k) for k in TRANSFORMERS_DEFAULTS}
    view = parse_hf_config({"model_type": "glm_moe_dsa", "num_hidden_layers": 5, "index_topk_pattern": "FFSFS"})
    assert view.indexer_types == ("full", "full", "shared", "full", "shared")
    assert (view.index_topk_freq, view.index_skip_topk_offset) == (2, 2) and view.rms_norm_eps == 1e-5
    view = parse_hf_config({"model_type": "glm_moe_dsa", "num_hidden_layers": 4, "index_topk_freq": 3})
    assert view.indexer_types == tuple(transformers.GlmMoeDsaConfig(num_hidden_layers=4,
                                                                    index_topk_freq=3).indexer_types)


@pytest.mark.parametrize("family, title", [("deepseek_v32", "DeepSeek-V3.2"), ("glm_moe_dsa", "GLM-5")])
def test_the_decoder_runs_a_dsa_model_and_refuses_what_it_cannot_in_one_sentence(family, title):
    """generate decodes both families (tests/inference/test_infer_dsa.py); a view without q-LoRA, and (GLM-5) an MTP
    depth that would reuse an earlier layer's top-k, are one sentence each."""
    from megatron_mtp.errors import is_one_sentence
    from megatron_mtp.models.family import get_family

    fam = get_family(family)
    assert fam.decodes  # generate's help lists it
    raw = {"model_type": family, "vocab_size": 320, "num_hidden_layers": 3, "hidden_size": 64, "intermediate_size": 96,
           "moe_intermediate_size": 32, "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": 32,
           "kv_lora_rank": 16, "qk_nope_head_dim": 16, "qk_rope_head_dim": 8, "v_head_dim": 16, "n_routed_experts": 8,
           "num_experts_per_tok": 2, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1, "index_n_heads": 4,
           "index_head_dim": 16, "index_topk_freq": 2, "index_skip_topk_offset": 1}
    layer = fam.decoder_layer()
    mtp = layer(fam.hf_view({**raw, "rms_norm_eps": 1e-5}), 3).self_attn
    assert mtp.indexer is not None  # MTP depth 0 runs its own indexer
    assert mtp.q_a_layernorm.eps == mtp.kv_a_layernorm.eps == 1e-5  # as megatron-core, not transformers' 1e-6
    with pytest.raises(UserError) as info:
        layer(dataclasses.replace(fam.hf_view(raw), q_lora_rank=None), 0)
    assert f"config.json of the {title} model has no q_lora_rank" in str(info.value)
    assert is_one_sentence(str(info.value))
    if family == "glm_moe_dsa":
        with pytest.raises(UserError) as info:
            layer(fam.hf_view(raw), 4)
        assert "MTP layer 4 of the GLM-5 model would reuse an earlier layer's top-k" in str(info.value)
        assert is_one_sentence(str(info.value))
