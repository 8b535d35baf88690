"""Each engine's naming rules, as this project understands them (test_engine_naming.py walks them over the planned
export of every shipped config): which tensor names each engine's model asks for, which names in a directory it
reads and how it renames them, from the directory's config.json alone (test_engine_naming.py's note says from which
source); they do not use the mapping table.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Optional


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
DSA = ("deepseek_v32", "glm_moe_dsa")
INDEXER = {f"self_attn.indexer.{n}" for n in ("wq_b.weight", "wk.weight", "k_norm.weight", "k_norm.bias",
                                               "weights_proj.weight")}


def engine_indexes(c: dict, i: int) -> bool:
    """vLLM (deepseek_v2.py, DeepseekV2MLAAttention) and SGLang: layer i builds an indexer unless IndexShare
    reuses a top-k there: from index_topk_pattern ("S"), else max(i - index_skip_topk_offset + 1, 0) %
    index_topk_freq (defaults 1 and 2); an MTP layer (i >= num_hidden_layers) always has one."""
    if i >= c["num_hidden_layers"]:
        return True
    if (pattern := c.get("index_topk_pattern")) is not None:
        return not (i < len(pattern) and pattern[i] == "S")
    return max(i - c.get("index_skip_topk_offset", 2) + 1, 0) % c.get("index_topk_freq", 1) == 0


def transformers_indexes(c: dict, i: int) -> bool:
    """transformers 5.25: no indexer where indexer_types says "shared" (GLM-5); DeepSeek-V3.2's every layer."""
    return i >= c["num_hidden_layers"] or c.get("indexer_types", ["full"] * (i + 1))[i] != "shared"


def decoder_layer(c: dict, moe: bool, bias: Optional[bool] = None, indexer: bool = True) -> set[str]:
    """Checkpoint names of one DeepSeek-V3(.2), GLM-4.5, GLM-5 or Qwen3-MoE decoder layer, relative to its prefix
    (``indexer``: a DSA layer's own indexer)."""
    names = {"input_layernorm.weight", "post_attention_layernorm.weight", "self_attn.o_proj.weight"}
    names |= INDEXER if indexer and c["model_type"] in DSA else set()
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


def main_model(c: dict, is_moe, head: bool, indexes=engine_indexes) -> set[str]:
    names = {"model.embed_tokens.weight", "model.norm.weight"} | ({"lm_head.weight"} if head else set())
    if c["model_type"] == GEMMA4:
        return names | {f"model.layers.{i}.{n}" for i, kind in enumerate(c["layer_types"])
                        for n in gemma4_layer(c, kind)}
    for i in range(c["num_hidden_layers"]):
        names |= {f"model.layers.{i}.{n}" for n in decoder_layer(c, is_moe(c, i), indexer=indexes(c, i))}
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
    """transformers 5.24's _keys_to_ignore_on_load_unexpected: DeepSeek-V3's (and V3.2's) layer 61, GLM-4.5's 92
    and 46, GLM-5's 78."""
    if c["model_type"] in (QWEN3, GEMMA4):
        return []
    if c["model_type"] == "glm_moe_dsa":
        return [r"model\.layers\.78.*"]
    return [r"model\.layers\.92.*", r"model\.layers\.46.*"] if c["model_type"] == "glm4_moe" else [
        r"model\.layers\.61.*"]


def transformers_target(c: dict, names: set[str]) -> Load:
    """MoE from first_k_dense_replace on; names matching the literal known MTP layers are ignored,
    other extra names are reported unexpected (a warning; `unknown` here)."""
    is_moe = sparse if c["model_type"] == QWEN3 else (lambda c, i: i >= c["first_k_dense_replace"])
    want = main_model(c, is_moe, head=not c["tie_word_embeddings"], indexes=transformers_indexes)
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
