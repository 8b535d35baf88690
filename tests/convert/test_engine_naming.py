"""Each engine's naming rules, as this project understands them, walked over the planned export of
every shipped config (and of small variants that reach each engine's limits).

The rules below are written from how vLLM 0.33, SGLang 0.5.23 and transformers 5.24 load a
DeepSeek-V3 directory, SGLang's main-branch source a Qwen3-MoE one, and vLLM's and SGLang's main-branch
source a DeepSeek-V3.2 or GLM-5 one (convert/README.md, "Serving", "Qwen3-MoE" and "Serving DeepSeek Sparse
Attention"), from the directory's config.json alone:
which tensor names each engine's model asks for, which names in the directory it reads, how it
renames them, and which directory it reads the draft from (taken from the commands SERVING.md
prints). They do not use the mapping table, so a change of an exported name that would break an
engine fails here. Where convert/serving.py says an engine cannot load a layout, the rules must
fail too (and the other way round); its kernel limits (hidden size, dtype) are not naming facts.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from pathlib import Path
from typing import Optional

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.convert import serving, serving_text
from megatron_mtp.convert.export_options import serving_export
from megatron_mtp.convert.to_hf import hf_configs, plan_export
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import release_mtp_name
from tests.convert.engine_rules import (
    Load,
    assistant_draft,
    engine_indexes,
    known_mtp_patterns,
    sglang_draft,
    sglang_target,
    transformers_indexes,
    transformers_mtp,
    transformers_target,
    vllm_draft,
    vllm_target,
)

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted((REPO / "configs").glob("*.yaml"))
VARIANTS = {  # the default model, changed where an engine has a limit
    "one_layer": ["model.num_layers=1", "model.first_k_dense=0"],
    "two_mtp_modules": ["mtp.num_layers=2"],
    "repeated_layer": ["mtp.num_layers=3", "mtp.repeated_layer=true"],
    "dense": ["model.num_experts=0", "model.router_num_groups=null", "model.router_group_topk=null"],
    "tied": ["model.tie_embeddings=true"],
    "full_rank_queries": ["model.q_lora_rank=null"],
    "hidden_512": ["model.hidden_size=512"],
}
TINY = str(REPO / "configs/tiny_cpu.yaml")
CASES = [(p.stem, str(p), []) for p in SHIPPED] + [(k, TINY, v) for k, v in VARIANTS.items()]
LAYOUTS = {"inline": ("inline", "hf"), "separate": ("separate", "hf"), "nextn": ("separate", "nextn"),
           "none": ("none", "hf")}
NAMING_FACTS = {"tied-head", "dense-draft", "layout", "one-layer", "depth", "draft-tokens", "inline-main", "no-draft"}
OUT = Path("/served/OUT")
NO_IDS = {"bos_token_id": None, "eos_token_id": None, "pad_token_id": None}


# -- the commands SERVING.md prints, read back -----------------------------------------------------------


def flags(argv: list[str]) -> dict[str, str]:
    return {argv[i]: argv[i + 1] for i in range(len(argv) - 1) if argv[i].startswith("--")}


def vllm_served(e: serving.Export, files: dict[Path, tuple[dict, set]]) -> tuple[Load, Optional[Load]]:
    argv = serving_text.vllm_argv(e, draft=e.depth > 0)
    target_dir, opts = Path(argv[2]), flags(argv)
    target = dict(files[target_dir][0], **json.loads(opts.get("--hf-overrides", "{}")))
    loads = vllm_target(target, files[target_dir][1])
    if not e.depth:
        return loads, None
    spec = json.loads(opts["--speculative-config"])
    assert spec["method"] == "mtp"
    draft_config, draft_names = files[Path(spec.get("model", target_dir))]
    if e.draft.own_model:
        return loads, assistant_draft(draft_config, draft_names, target)
    return loads, vllm_draft(target, draft_config, draft_names, spec["num_speculative_tokens"])


def sglang_served(e: serving.Export, files: dict[Path, tuple[dict, set]]) -> tuple[Load, Optional[Load]]:
    opts = flags(serving_text.sglang_argv(e, draft=e.depth > 0))
    target_dir = Path(opts["--model-path"])
    loads = sglang_target(*files[target_dir])
    if not e.depth:
        return loads, None
    assert opts["--speculative-algorithm"] == "NEXTN"
    assert int(opts["--speculative-num-draft-tokens"]) == int(opts["--speculative-num-steps"]) + 1
    draft_config, draft_names = files[Path(opts.get("--speculative-draft-model-path", target_dir))]
    if e.draft.own_model:  # promoted to FROZEN_KV_MTP by the draft's architecture
        assert draft_config["architectures"] == ["Gemma4AssistantForCausalLM"]
        return loads, assistant_draft(draft_config, draft_names, files[target_dir][0])
    arch = draft_config["architectures"][0]  # SGLang maps the target's name to its NextN class
    assert arch in ("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "DeepseekV32ForCausalLM",  # V3.2 and
                    "GlmMoeDsaForCausalLM", "Glm4MoeForCausalLM",  # GLM-5 draft as DeepseekV3ForCausalLMNextN
                    "Glm4MoeForCausalLMNextN", "Qwen3MoeForCausalLM", "Gemma4ForCausalLM", "Gemma4ForCausalLMNextN")
    return loads, sglang_draft(draft_config, draft_names)


def transformers_served(e: serving.Export, files: dict[Path, tuple[dict, set]]) -> tuple[Load, Optional[Load]]:
    code = serving_text.transformers_code(e)
    target_dir = Path(json.loads(re.search(r"AutoModelForCausalLM\.from_pretrained\((\".*?\")\)", code).group(1)))
    config, names = files[target_dir]
    loads = transformers_target(config, names)
    if not e.depth:
        return loads, None
    if e.draft.own_model:
        code = e.draft.transformers_code(e)
        source = Path(json.loads(re.search(r"Gemma4AssistantForCausalLM\.from_pretrained\((\".*?\")\)", code).group(1)))
        return loads, assistant_draft(*files[source], config)
    mtp = serving_text.transformers_mtp_code(e)
    config = dict(config)
    if m := re.search(r"model\.config\.num_mtp_layers = (\d+)", mtp):
        config["num_nextn_predict_layers"] = int(m.group(1))
    source = target_dir
    if m := re.search(r"model\.config\.name_or_path = (\".*?\")", mtp):
        source = Path(json.loads(m.group(1)))
    patterns = known_mtp_patterns(config)
    if m := re.search(r"model\._keys_to_ignore_on_load_unexpected = (\[.*?\])", mtp):
        patterns = ast.literal_eval(m.group(1))
    assert "use_mtp=True" in mtp
    return loads, transformers_mtp(config, patterns, files[source][1])


SERVED = {"vllm": vllm_served, "sglang": sglang_served, "transformers": transformers_served}


# -- the walk --------------------------------------------------------------------------------------------


def planned(case: tuple, layout: str) -> Optional[tuple[serving.Export, dict[Path, tuple[dict, set]]]]:
    """(serving facts, {directory: (config.json, tensor names)}) of an export, written nowhere."""
    _, path, overrides = case
    cfg = load_config(path, overrides)
    mode, naming = LAYOUTS[layout]
    own_names = get_family(cfg.model.family).table.mtp_names is not release_mtp_name
    if naming == "nextn" and (cfg.mtp.modules > 1 or own_names):
        return None  # refused by to-hf
    if cfg.mtp.style == "assistant" and mode == "inline":
        return None  # refused by to-hf: a model of its own
    vocab = cfg.model.vocab_size or 4096
    plan = plan_export(cfg, vocab, mode, naming)
    configs = hf_configs(cfg, vocab, mode, naming, "bf16", NO_IDS)
    export = serving_export(cfg, OUT, mode, naming, "bf16")
    dirs = {"main": export.main_dir, "mtp": export.mtp_dir}
    files = {dirs[part]: (configs[part], {t.name for t in tensors}) for part, tensors in plan.items()}
    return export, files


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_engines_load_what_serving_says_they_load(case, layout):
    found = planned(case, layout)
    if found is None:
        pytest.skip("to-hf refuses this layout for this depth")
    export, files = found
    for engine, served in SERVED.items():
        facts = {p.fact: p for p in serving.problems(engine, export)}
        target, draft = served(export, files)
        blocked = {f for f, p in facts.items() if p.blocks == "model" and f in NAMING_FACTS}
        assert target.ok == (not blocked), (engine, target, facts)
        # only the inline layout has MTP layers beside the main model (SERVING.md says so)
        assert bool(target.reported) == (layout == "inline" and engine == "transformers"
                                          and not export.transformers_finds_mtp), target.reported
        if draft is None:
            continue
        naming = {f for f, p in facts.items() if p.blocks == "draft" and f in NAMING_FACTS}
        assert draft.ok == (not naming), (engine, draft, facts)


def test_the_variants_reach_every_naming_fact():
    """The walk above only proves something if some case hits each fact the rules can see."""
    seen = set()
    for case in CASES:
        for layout in LAYOUTS:
            found = planned(case, layout)
            if found is not None:
                seen |= {p.fact for e in serving.ENGINES for p in serving.problems(e, found[0])}
    assert NAMING_FACTS - {"draft-tokens"} <= seen


@pytest.mark.parametrize("k, ok", [(1, True), (2, True), (3, False), (4, True)])
def test_vllm_draft_tokens_follow_the_depth(k, ok):
    export, files = planned(("two", TINY, ["mtp.num_layers=2"]), "inline")
    export = dataclasses.replace(export, speculative=k)
    assert vllm_served(export, files)[1].ok == ok
    assert ("draft-tokens" not in {p.fact for p in serving.problems("vllm", export)}) == ok


@pytest.mark.parametrize("layout", ["inline", "separate", "nextn"])
def test_a_repeated_mtp_layer_exports_one_module_and_serves_the_depth_it_was_trained_for(layout):
    case = ("repeated", TINY, VARIANTS["repeated_layer"])
    export, files = planned(case, layout)
    config, names = files[export.mtp_dir]
    layers = {int(re.match(r"model\.layers\.(\d+)\.", n).group(1)) for n in names if n.startswith("model.layers.")}
    decoder = load_config(TINY).model.num_layers
    mtp = {n for n in layers if n >= decoder} if layout != "nextn" else layers  # NextN renumbers from 0
    assert config["num_nextn_predict_layers"] == 1 and mtp == ({0} if layout == "nextn" else {decoder})
    assert export.depth == 1 and export.repeats == 3
    argv = serving_text.vllm_argv(export, True)
    assert json.loads(argv[argv.index("--speculative-config") + 1])["num_speculative_tokens"] == 3
    assert serving_text.sglang_steps(export) == 3
    assert "1 MTP module trained to draft 3 tokens" in serving_text._draft_words(export)


@pytest.mark.parametrize("layout", ["separate", "nextn"])
def test_index_share_layers_have_no_indexer_and_the_engines_find_the_same_ones(layout):
    """GLM-5's IndexShare: the export has an indexer where a layer runs one (layers 0 and 2 of 3, and the MTP
    layer); vLLM's rule over index_topk_freq/index_skip_topk_offset and transformers' indexer_types agree."""
    export, files = planned(("glm5", str(REPO / "configs/glm_moe_dsa_tiny_cpu.yaml"), []), layout)
    config, names = files[export.main_dir]
    layers = range(config["num_hidden_layers"])
    has = {i for i in layers if f"model.layers.{i}.self_attn.indexer.wk.weight" in names}
    assert has == {i for i in layers if engine_indexes(config, i)} == {i for i in layers
                                                                      if transformers_indexes(config, i)} == {0, 2}
    mtp_config, mtp_names = files[export.mtp_dir]
    layer = 0 if layout == "nextn" else 3
    assert f"model.layers.{layer}.self_attn.indexer.weights_proj.weight" in mtp_names
    assert mtp_config["architectures"] == (["DeepseekV3ForCausalLMNextN"] if layout == "nextn"
                                           else ["GlmMoeDsaForCausalLM"])


@pytest.mark.parametrize("config", ["deepseek_v32_tiny_cpu", "glm5"])
def test_dsa_serving_md_gives_each_engine_its_speculative_flags(config):
    export, _ = planned((config, str(REPO / f"configs/{config}.yaml"), []), "inline")
    found = [p for e in serving.ENGINES for p in serving.problems(e, export)]
    text = serving_text.serving_text(export, found)
    if config == "glm5":  # the release shape: nothing in the way
        assert found == [] and '"method": "mtp"' in text and "--speculative-algorithm NEXTN" in text
    else:  # index_head_dim 32: neither engine's indexer kernels take it
        assert {(p.engine, p.fact) for p in found if p.blocks == "model"} == {("vllm", "index-head"),
                                                                             ("sglang", "index-head")}
    assert f"serves model_type {get_family(export.family).hf_model_types[0]} as `deepseek_mtp`" in text


def test_the_plan_is_what_the_export_writes(trained_run, export_fp32, tmp_path):
    """The walk uses planned names; a real export writes exactly those."""
    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint

    cfg = read_config(resolve_checkpoint(trained_run).path)
    vocab = json.loads((export_fp32 / "main" / "config.json").read_text())["vocab_size"]
    plan = plan_export(cfg, vocab, "separate", "hf", "fp32")
    for part in ("main", "mtp"):
        index = json.loads((export_fp32 / part / "model.safetensors.index.json").read_text())["weight_map"]
        assert set(index) == {t.name for t in plan[part]}, part
