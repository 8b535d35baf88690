"""Each engine's naming rules, as this project understands them, walked over the planned export of
every shipped config (and of small variants that reach each engine's limits).

The rules below are written from how vLLM 0.33, SGLang 0.5.23 and transformers 5.24 load a
DeepSeek-V3 directory, and SGLang's main-branch source a Qwen3-MoE one (convert/README.md, "Serving"
and "Qwen3-MoE"), from the directory's config.json alone:
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.convert import serving, serving_text
from megatron_mtp.convert.export_options import serving_export
from megatron_mtp.convert.to_hf import hf_configs, plan_export
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import release_mtp_name

REPO = Path(__file__).resolve().parents[2]
SHIPPED = sorted(p for p in (REPO / "configs").glob("*.yaml")
                 # the engines' DeepSeek-V3.2 and GLM-5 loaders are not modelled here (their SERVING.md says so)
                 if not p.stem.startswith(("deepseek_v32", "glm5", "glm_moe_dsa")))
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


@dataclass
class Load:
    """What one engine model made of one directory."""

    error: Optional[str] = None
    missing: set = field(default_factory=set)
    """Parameters the engine's model has and nothing loaded (an error, or silently uninitialised)."""
    unknown: set = field(default_factory=set)
    """Names the engine read but has no parameter for (an error or a warning)."""
    reported: set = field(default_factory=set)
    """MTP-layer names transformers reports as unexpected while the main model is complete."""

    @property
    def ok(self) -> bool:
        return self.error is None and not self.missing and not self.unknown


# -- the engines' rules, in our words ------------------------------------------------------------------


QWEN3 = "qwen3_moe"
GEMMA4 = "gemma4_text"


def decoder_layer(c: dict, moe: bool, bias: Optional[bool] = None) -> set[str]:
    """Checkpoint names of one DeepSeek-V3, GLM-4.5 or Qwen3-MoE decoder layer, relative to its prefix."""
    names = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"}
    if c["model_type"] == QWEN3:  # q/k/v without a bias, q/k norms always; softmax router, no shared experts
        names |= {f"self_attn.{p}_proj.weight" for p in "qkv"} | {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}
        if not moe:
            return names | {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
        return names | {"mlp.gate.weight"} | {f"mlp.experts.{e}.{p}_proj.weight" for e in range(c["num_experts"])
                                                for p in ("gate", "up", "down")}
    if c["model_type"] == "glm4_moe":  # q/k/v with an optional bias and per-head q/k norms
        names |= {f"self_attn.{p}_proj.{w}" for p in "qkv" for w in ("weight", "bias")[:1 + c["attention_bias"]]}
        names |= {"self_attn.q_norm.weight", "self_attn.k_norm.weight"} if c["use_qk_norm"] else set()
    else:
        names |= {"self_attn.kv_a_proj_with_mqa.weight", "self_attn.kv_a_layernorm.weight",
                  "self_attn.kv_b_proj.weight"}
    if c["model_type"] == "glm4_moe":
        pass  # its attention is above
    elif c["q_lora_rank"] is not None:
        names |= {"self_attn.q_a_proj.weight", "self_attn.q_a_layernorm.weight", "self_attn.q_b_proj.weight"}
    else:
        names.add("self_attn.q_proj.weight")
    if not moe:
        return names | {f"mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    names.add("mlp.gate.weight")
    if bias if bias is not None else c.get("topk_method", "noaux_tc") == "noaux_tc":  # GLM: always
        names.add("mlp.gate.e_score_correction_bias")
    experts = range(c["n_routed_experts"] or 0)
    names |= {f"mlp.experts.{e}.{p}_proj.weight" for e in experts for p in ("gate", "up", "down")}
    if c["n_shared_experts"]:
        names |= {f"mlp.shared_experts.{p}_proj.weight" for p in ("gate", "up", "down")}
    return names


def gemma4_layer(c: dict, kind: str) -> set[str]:
    """Gemma4TextDecoderLayer's parameters: no v_proj where a full layer's keys are its values; the MoE block's
    router and stacked experts with enable_moe_block."""
    names = {f"{n}.weight" for n in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                                     "post_feedforward_layernorm", "self_attn.q_proj", "self_attn.k_proj",
                                     "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj",
                                     "mlp.up_proj", "mlp.down_proj")} | {"layer_scalar"}
    if not (kind == "full_attention" and c["attention_k_eq_v"]):
        names.add("self_attn.v_proj.weight")
    if c["enable_moe_block"]:
        names |= {"router.proj.weight", "router.scale", "router.per_expert_scale", "experts.gate_up_proj",
                  "experts.down_proj", "post_feedforward_layernorm_1.weight", "post_feedforward_layernorm_2.weight",
                  "pre_feedforward_layernorm_2.weight"}
    return names


def main_model(c: dict, is_moe, head: bool) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} if head else set())
    if c["model_type"] == GEMMA4:
        return names | {f"model.layers.{i}.{n}" for i, kind in enumerate(c["layer_types"])
                        for n in gemma4_layer(c, kind)}
    for i in range(c["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{n}" for n in decoder_layer(c, is_moe(c, i))}
    return names


def layer_index(name: str) -> Optional[int]:
    m = re.match(r"model\.layers\.(\d+)\.", name)
    return int(m.group(1)) if m else None


def sparse(c: dict, i: int) -> bool:
    """vLLM and SGLang: MoE if there are routed experts, from first_k_dense_replace on, every moe_layer_freq;
    Qwen3-MoE: where (i + 1) % decoder_sparse_step == 0, outside mlp_only_layers."""
    if c["model_type"] == QWEN3:
        return c["num_experts"] > 0 and (i + 1) % c["decoder_sparse_step"] == 0 and i not in c["mlp_only_layers"]
    if c["model_type"] == GEMMA4:
        return c["enable_moe_block"]
    return c["n_routed_experts"] is not None and i >= c["first_k_dense_replace"] and i % c.get("moe_layer_freq", 1) == 0


def vllm_target(c: dict, names: set[str]) -> Load:
    """Names of MTP layers L..L+D-1 (D from this config) are skipped; every other name must be a
    parameter (else KeyError) and every parameter must be loaded (strict check)."""
    L, D = c["num_hidden_layers"], c["num_nextn_predict_layers"]
    if c["model_type"] == QWEN3 and any(not n.startswith(("model.", "lm_head.")) for n in names):
        return Load(error="AutoWeightsLoader: Qwen3MoeForCausalLM has no module 'mtp'")  # it skips nothing
    if c["model_type"] == GEMMA4:  # its loader skips nothing and ties lm_head to the embedding
        want = main_model(c, sparse, head=not c["tie_word_embeddings"])
        return Load(missing=want - names, unknown=names - want)
    read = {n for n in names if not (layer_index(n) is not None and L <= layer_index(n) < L + D)}
    want = main_model(c, sparse, head=True)
    return Load(missing=want - read, unknown=read - want)


def vllm_draft(target: dict, draft: dict, names: set[str], k: int) -> Load:
    """The draft's layers come from the TARGET's config (L, D); its blocks from the draft's config.
    Only names of layers L..L+D-1 are read (and a top-level embedding); enorm/hnorm/eh_proj/shared_head
    keep their names, embed_tokens becomes the one draft embedding, the rest goes under mtp_block."""
    if target["model_type"] in (QWEN3, GEMMA4):
        return Load(error=f"no MTP model type for {target['model_type']}")
    n_predict = draft["num_nextn_predict_layers"]
    if n_predict == 0 or (k > n_predict and k % n_predict):
        return Load(error=f"num_speculative_tokens {k} with n_predict {n_predict}")
    L, D = target["num_hidden_layers"], target["num_nextn_predict_layers"]
    want = {"model.embed_tokens.weight"}
    for i in range(L, L + D):
        want |= {f"model.layers.{i}.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                   "shared_head.norm.weight", "shared_head.head.weight")}
        want |= {f"model.layers.{i}.mtp_block.{n}" for n in decoder_layer(draft, sparse(draft, i))}
    got, unknown = set(), set()
    for name in names:
        i = layer_index(name)
        if i is None or not L <= i < L + D:
            if name == "model.embed_tokens.weight":
                got.add(name)
            continue
        rest = name[len(f"model.layers.{i}."):]
        if rest.startswith(("enorm.", "hnorm.", "eh_proj.", "shared_head.")):
            to = name
        elif rest.startswith("embed_tokens."):
            to = "model.embed_tokens.weight"
        else:
            to = f"model.layers.{i}.mtp_block.{rest}"
        (got if to in want else unknown).add(to)
    return Load(missing=want - got, unknown=unknown)


def sglang_target(c: dict, names: set[str]) -> Load:
    """Names of layers outside 0..L-1 are dropped; unknown names only warn; nothing checks that every
    parameter was loaded (so a missing one is silently uninitialised)."""
    L = c["num_hidden_layers"]
    read = {n for n in names if layer_index(n) is None or layer_index(n) < L}
    if c["model_type"] == GEMMA4:  # its Gemma 4 loader refuses a name it has no parameter for
        read = set(names)
    if c["model_type"] == QWEN3:  # its loader passes over every name holding "mtp"
        read = {n for n in read if "mtp" not in n}
    want = main_model(c, sparse, head=not c["tie_word_embeddings"])
    return Load(missing=want - read, unknown=read - want)


def sglang_draft(c: dict, names: set[str]) -> Load:
    """One NextN layer from the draft directory's own config: id 0 if num_hidden_layers is 1, else
    num_hidden_layers; names starting with model.layers.{id} (no trailing dot), the embedding and head
    copies skipped, the MTP norms/eh_proj to model.*, the rest to model.decoder.*; always a MoE block."""
    if c["model_type"] == QWEN3:
        return sglang_qwen3_draft(c, names)
    if c["model_type"] == GEMMA4:
        return Load(error="no NextN model for Gemma 4")
    if c.get("num_nextn_predict_layers") != 1:
        return Load(error=f"num_nextn_predict_layers {c.get('num_nextn_predict_layers')}: only 1 is supported")
    layer = 0 if c["num_hidden_layers"] == 1 else c["num_hidden_layers"]
    prefix = f"model.layers.{layer}"
    want = {f"model.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "shared_head.norm.weight")}
    want |= {f"model.decoder.{n}" for n in decoder_layer(c, moe=True)}
    got, unknown = set(), set()
    for name in names:
        if not name.startswith(prefix) or "shared_head.head" in name or "embed_tokens" in name:
            continue
        own = any(k in name for k in ("shared_head.norm", "eh_proj", "enorm", "hnorm"))
        to = name.replace(prefix, "model" if own else "model.decoder", 1)
        (got if to in want else unknown).add(to)
    return Load(missing=want - got, unknown=unknown)


def sglang_qwen3_draft(c: dict, names: set[str]) -> Load:
    """Qwen3MoeForCausalLMMTP: one layer (num_hidden_layers and num_nextn_predict_layers forced to 1), built
    by the target's decoder_sparse_step/mlp_only_layers at index 0; of the names holding "mtp", mtp.fc,
    mtp.pre_fc_norm_embedding and mtp.pre_fc_norm_hidden lose the "mtp." and every other has "mtp" replaced
    by "model"; a name whose layer index is not 0, or that is no parameter, is skipped; the embedding and
    head are the target's."""
    want = {"fc.weight", "pre_fc_norm_embedding.weight", "pre_fc_norm_hidden.weight", "model.norm.weight"}
    want |= {f"model.layers.0.{n}" for n in decoder_layer(c, sparse(c, 0))}
    got = set()
    for name in names:
        if "mtp" not in name:
            continue
        if name in ("mtp.fc.weight", "mtp.pre_fc_norm_embedding.weight", "mtp.pre_fc_norm_hidden.weight"):
            to = name.replace("mtp.", "")
        else:
            to = name.replace("mtp", "model")
        index = re.search(r"layers\.(\d+)\.", to)
        if (index is None or index.group(1) == "0") and to in want:
            got.add(to)
    return Load(missing=want - got)


def assistant_draft(c: dict, names: set[str], target: dict) -> Load:
    """Gemma 4's assistant (vLLM's Gemma4MTP, SGLang's FROZEN_KV_MTP, transformers' Gemma4AssistantForCausalLM,
    each from the directory's own config.json): its text stack of query-only layers (no key/value projections:
    every layer reads the target's), its final norm and tied table, the two projections from and to the
    target's width; a layer kind the target lacks has nothing to read."""
    if c.get("model_type") != "gemma4_assistant" or c.get("backbone_hidden_size") != target["hidden_size"]:
        return Load(error="not an assistant of this target")
    text = c["text_config"]
    if not set(text["layer_types"]) <= set(target["layer_types"]):
        return Load(error="the target stores no keys of a kind the assistant reads")
    want = {"model.embed_tokens.weight", "model.norm.weight", "pre_projection.weight", "post_projection.weight"}
    for i in range(text["num_hidden_layers"]):
        want |= {f"model.layers.{i}.{n}" for n in (
            "input_layernorm.weight", "post_attention_layernorm.weight", "pre_feedforward_layernorm.weight",
            "post_feedforward_layernorm.weight", "layer_scalar", "self_attn.q_proj.weight", "self_attn.q_norm.weight",
            "self_attn.o_proj.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight")}
    return Load(missing=want - names, unknown=names - want)


def known_mtp_patterns(c: dict) -> list[str]:
    """transformers 5.24's _keys_to_ignore_on_load_unexpected: DeepSeek-V3's layer 61, GLM-4.5's 92 and 46."""
    if c["model_type"] in (QWEN3, GEMMA4):
        return []
    return [r"model\.layers\.92.*", r"model\.layers\.46.*"] if c["model_type"] == "glm4_moe" else [
        r"model\.layers\.61.*"]


def transformers_target(c: dict, names: set[str]) -> Load:
    """MoE from first_k_dense_replace on; names matching the literal known MTP layers are ignored,
    other extra names are reported unexpected (a warning; `unknown` here)."""
    is_moe = sparse if c["model_type"] == QWEN3 else (lambda c, i: i >= c["first_k_dense_replace"])
    want = main_model(c, is_moe, head=not c["tie_word_embeddings"])
    extra = {n for n in names - want if not any(re.search(p, n) for p in known_mtp_patterns(c))}
    mtp_layers = {n for n in extra if (layer_index(n) or 0) >= c["num_hidden_layers"] or n.startswith("mtp.")}
    return Load(missing=want - names, unknown=extra - mtp_layers, reported=mtp_layers)


def transformers_mtp(c: dict, patterns: list[str], names: set[str]) -> Load:
    """MtpModel: num_mtp_layers modules, read from config.name_or_path; the weights are the names matching
    the ignore patterns whose first number is >= num_hidden_layers; layer L+d becomes module d; always
    MoE; embed_tokens and shared_head.head copies are ignored; anything missing is a RuntimeError."""
    if c["model_type"] in (QWEN3, GEMMA4):
        return Load(error=f"{c['architectures'][0]} has no MTP layer")
    L, D = c["num_hidden_layers"], c["num_nextn_predict_layers"]
    kept = [p for p in patterns if int(re.search(r"\.(\d+)", p).group(1)) >= L]
    if D == 0 or not kept:
        return Load(error="no MTP layer to load")
    read = {n for n in names if any(re.search(p, n) for p in kept)}
    want, optional = set(), set()
    for i in range(L, L + D):
        want |= {f"model.layers.{i}.{n}" for n in ("enorm.weight", "hnorm.weight", "eh_proj.weight",
                                                   "shared_head.norm.weight")}
        want |= {f"model.layers.{i}.{n}" for n in decoder_layer(c, moe=True, bias=True)}
        optional |= {f"model.layers.{i}.embed_tokens.weight", f"model.layers.{i}.shared_head.head.weight"}
    return Load(missing=want - read, unknown=read - want - optional)


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
    assert arch in ("DeepseekV3ForCausalLM", "DeepseekV3ForCausalLMNextN", "Glm4MoeForCausalLM",
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
        blocked = {f for f, p in facts.items() if p.blocks == "model"}
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
