"""THE tensor table of the DeepSeek-V3 family: megatron-core sharded keys, Hugging Face names,
global shapes, tensor-parallel splits, and which layers hold what.

Both conversion directions (convert/to_hf.py, convert/from_hf.py), drop-mtp, the converter's shape
checks (convert/shapes.py), plan's per-rank parameter sizes (plan/params.py) and the analytic
parameter and FLOP counts (size.py) use this table and nothing else, so a new tensor is added in
one place; whether a layer is MoE is decided here too (``is_moe_layer``, ``mtp_is_moe``).

Keys are the *global* sharded-checkpoint keys (torch_dist ``.metadata``), which do not depend on the
training layout: decoder layers carry their global index in the key (``decoder.layers.N.``), routed
experts are one tensor per layer with a leading global-expert axis (``...experts.experts.linear_fc1
.weight`` of shape [E, 2F, H]), and a TP-sharded SwiGLU fc1 is stored globally as [gate; up] (the
checkpoint factory splits every TP shard into its gate and up halves and places them in the two
global halves). So a rule is: one mcore key <-> one HF name, or <-> (gate, up) concatenated on dim 0,
optionally repeated over the expert axis.

The table is built from the typed model config (``ModelConfig``) and the MTP depth. MTP module d
(0-based) is HF layer ``num_hidden_layers + d``; the index always comes from the config.

Parallel MTP heads (``mtp.style: parallel``, models/deepseek_v3/parallel_heads.py) have no Hugging Face
format; they are exported to their own ``mtp/`` directory (convert/parallel_heads_export.py) as
``heads.{i}.`` + the decoder-layer names of ``model.layers.N.`` (``self_attn.*``, ``mlp.*``, the two
layer norms) and ``heads.{i}.norm.weight`` (the head's final norm); they share the main ``lm_head``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Optional

from megatron_mtp.config.model import ModelConfig

Part = Literal["main", "mtp"]
Spec = Literal["local", "te"]


Shape = Callable[[ModelConfig], tuple]
Split = Literal["tp", "none", "local"]
Role = Literal["weight", "norm", "block_norm", "buffer"]


@dataclass(frozen=True)
class Rule:
    """One tensor of a decoder layer, relative to the layer prefixes: its names, its global shape
    (per expert for routed experts), how tensor parallelism splits it and what it is."""

    mcore: str
    hf: tuple[str, ...]
    shape: Shape
    split: Split = "tp"
    """"tp": split over the TP ranks (ETP for routed experts); "none": whole on every rank;
    "local": split only by the local spec (Transformer Engine keeps MLA's down-projections whole)."""
    role: Role = "weight"
    """"block_norm": the norm that opens the attention or MLP block; "norm": any other norm weight;
    "buffer": not a parameter (no gradient, no optimizer state)."""
    experts: bool = False
    spec: Optional[Spec] = None  # None: same name in both specs
    keep_fp32: bool = False

    def numel(self, model: ModelConfig) -> int:
        return math.prod(self.shape(model))


@dataclass(frozen=True)
class Param:
    """One global megatron-core tensor and the HF tensor(s) it becomes."""

    mcore: str
    hf: tuple[str, ...]
    """One name, or (gate, up) = the two halves of dim 0 (per expert when num_experts > 0)."""
    part: Part
    num_experts: int = 0
    """>0: the mcore tensor has a leading expert axis and the HF names hold ``{e}``."""
    keep_fp32: bool = False
    """Stored in fp32 even in a bf16 export (DeepSeek's e_score_correction_bias)."""
    copy: bool = False
    """An MTP copy of the main embedding/head: written on export, not read back on import."""

    def hf_names(self) -> list[str]:
        if not self.num_experts:
            return list(self.hf)
        return [name.format(e=e) for e in range(self.num_experts) for name in self.hf]


def _qk(m: ModelConfig) -> int:
    return m.qk_head_dim + m.qk_pos_emb_head_dim


def _h(m: ModelConfig) -> tuple:
    return (m.hidden_size,)


_ATTENTION = (
    Rule("input_layernorm.weight", ("input_layernorm.weight",), _h, "none", "block_norm"),
    Rule("self_attention.linear_q_down_proj.weight", ("self_attn.q_a_proj.weight",),
         lambda m: (m.q_lora_rank, m.hidden_size), "local"),
    Rule("self_attention.q_layernorm.weight", ("self_attn.q_a_layernorm.weight",),
         lambda m: (m.q_lora_rank,), "none", "norm", spec="local"),
    Rule("self_attention.linear_q_up_proj.layer_norm_weight", ("self_attn.q_a_layernorm.weight",),
         lambda m: (m.q_lora_rank,), "none", "norm", spec="te"),
    Rule("self_attention.linear_q_up_proj.weight", ("self_attn.q_b_proj.weight",),
         lambda m: (m.num_attention_heads * _qk(m), m.q_lora_rank)),
    Rule("self_attention.linear_q_proj.weight", ("self_attn.q_proj.weight",),
         lambda m: (m.num_attention_heads * _qk(m), m.hidden_size)),
    Rule("self_attention.linear_kv_down_proj.weight", ("self_attn.kv_a_proj_with_mqa.weight",),
         lambda m: (m.kv_lora_rank + m.qk_pos_emb_head_dim, m.hidden_size), "local"),
    Rule("self_attention.kv_layernorm.weight", ("self_attn.kv_a_layernorm.weight",),
         lambda m: (m.kv_lora_rank,), "none", "norm", spec="local"),
    Rule("self_attention.linear_kv_up_proj.layer_norm_weight", ("self_attn.kv_a_layernorm.weight",),
         lambda m: (m.kv_lora_rank,), "none", "norm", spec="te"),
    Rule("self_attention.linear_kv_up_proj.weight", ("self_attn.kv_b_proj.weight",),
         lambda m: (m.num_attention_heads * (m.qk_head_dim + m.v_head_dim), m.kv_lora_rank)),
    Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",),
         lambda m: (m.hidden_size, m.num_attention_heads * m.v_head_dim)),
)
_DENSE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), _h, "none", "block_norm", spec="local"),
    Rule("mlp.linear_fc1.layer_norm_weight", ("post_attention_layernorm.weight",), _h, "none", "block_norm",
         spec="te"),
    Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         lambda m: (2 * m.ffn_hidden_size, m.hidden_size)),
    Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), lambda m: (m.hidden_size, m.ffn_hidden_size)),
)
_MOE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), _h, "none", "block_norm"),
    Rule("mlp.router.weight", ("mlp.gate.weight",), lambda m: (m.num_experts, m.hidden_size), "none"),
    Rule("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), lambda m: (m.num_experts,), "none",
         "buffer", keep_fp32=True),
    Rule("mlp.experts.experts.linear_fc1.weight",
         ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
         lambda m: (2 * m.moe_ffn_hidden_size, m.hidden_size), experts=True),
    Rule("mlp.experts.experts.linear_fc2.weight", ("mlp.experts.{e}.down_proj.weight",),
         lambda m: (m.hidden_size, m.moe_ffn_hidden_size), experts=True),
    Rule("mlp.shared_experts.linear_fc1.weight",
         ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
         lambda m: (2 * m.moe_ffn_hidden_size * m.num_shared_experts, m.hidden_size)),
    Rule("mlp.shared_experts.linear_fc2.weight", ("mlp.shared_experts.down_proj.weight",),
         lambda m: (m.hidden_size, m.moe_ffn_hidden_size * m.num_shared_experts)),
)
_MTP_OWN = (
    Rule("enorm.weight", ("enorm.weight",), _h, "none", "norm"),
    Rule("hnorm.weight", ("hnorm.weight",), _h, "none", "norm"),
    Rule("eh_proj.weight", ("eh_proj.weight",), lambda m: (m.hidden_size, 2 * m.hidden_size)),
    Rule("final_layernorm.weight", ("shared_head.norm.weight",), _h, "none", "norm"),
)
HEAD_NORM = Rule("final_layernorm.weight", ("norm.weight",), _h, "none", "norm")
"""A parallel MTP head's own final norm."""

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT_LAYER = "output_layer.weight"

# Megatron-core keys under these prefixes are model weights; anything else (optimizer state,
# RNG, ``_extra_state`` objects) is never read by the converter.
MODEL_KEY_PREFIXES = ("embedding.", "decoder.", "output_layer.", "mtp.", "mtp_heads.")
MTP_KEY_PREFIXES = ("mtp.", "mtp_heads.")
"""Keys of the sequential MTP block and of the parallel heads."""


def is_moe_layer(model: ModelConfig, index: int) -> bool:
    """Decoder layer ``index`` (0-based) has a routed MLP: every layer after the first ``first_k_dense``."""
    return model.num_experts > 0 and index >= model.first_k_dense


def moe_layer_count(model: ModelConfig) -> int:
    """How many decoder layers are MoE."""
    return sum(is_moe_layer(model, i) for i in range(model.num_layers))


def mtp_is_moe(model: ModelConfig) -> bool:
    """MTP layers and parallel heads are built like the last decoder layer (models/deepseek_v3/specs.py)."""
    return is_moe_layer(model, model.num_layers - 1)


def layer_rules(model: ModelConfig, moe: bool, spec: Optional[Spec]) -> list[Rule]:
    """The tensors of one decoder layer (dense or MoE) of ``model``, in one spec's spelling (None: both)."""
    return list(_layer_rules(moe, model.q_lora_rank is not None, spec, model.router_enable_expert_bias))


def block_rules(model: ModelConfig, block: Literal["attention", "dense_mlp", "moe_mlp"],
                spec: Optional[Spec]) -> list[Rule]:
    """The tensors of one block of a decoder layer: its attention, or its dense or routed MLP."""
    group = {"attention": _ATTENTION, "dense_mlp": _DENSE_MLP, "moe_mlp": _MOE_MLP}[block]
    return [r for r in layer_rules(model, block == "moe_mlp", spec) if r in group]


def mtp_own_rules() -> tuple[Rule, ...]:
    """What a sequential MTP module holds besides its transformer layer."""
    return _MTP_OWN


def rule_for_key(key: str) -> Rule:
    """The rule of a global megatron-core key (any layer, MTP module or head); KeyError if none."""
    for rule in (*_ATTENTION, *_DENSE_MLP, *_MOE_MLP, *_MTP_OWN):
        if key.endswith("." + rule.mcore):
            return rule
    raise KeyError(key)


def mtp_hf_layer(model: ModelConfig, depth: int) -> int:
    """HF layer index of MTP module ``depth``."""
    return model.num_layers + depth


def mcore_mtp_prefix(depth: int) -> str:
    return f"mtp.layers.{depth}."


def _layer_rules(moe: bool, q_lora: bool, spec: Optional[Spec], expert_bias: bool = True) -> Iterator[Rule]:
    for rule in _ATTENTION + (_MOE_MLP if moe else _DENSE_MLP):
        if not expert_bias and rule.mcore == "mlp.router.expert_bias":
            continue
        if spec is not None and rule.spec not in (None, spec):
            continue
        if q_lora and rule.mcore.startswith("self_attention.linear_q_proj"):
            continue
        if not q_lora and ("q_down" in rule.mcore or "q_up" in rule.mcore or "q_layernorm" in rule.mcore):
            continue
        yield rule


def _params_for_layer(
    mcore_prefix: str, hf_prefix: str, moe: bool, model: ModelConfig, part: Part, spec: Optional[Spec]
) -> Iterator[Param]:
    q_lora = model.q_lora_rank is not None
    for rule in _layer_rules(moe, q_lora, spec, model.router_enable_expert_bias):
        yield Param(
            mcore=mcore_prefix + rule.mcore,
            hf=tuple(hf_prefix + h for h in rule.hf),
            part=part,
            num_experts=model.num_experts if rule.experts else 0,
            keep_fp32=rule.keep_fp32,
        )


def mcore_head_prefix(index: int) -> str:
    """megatron-core prefix of parallel head ``index`` (0-based)."""
    return f"mtp_heads.layers.{index}."


def hf_head_prefix(index: int) -> str:
    """Name prefix of parallel head ``index`` in its exported ``mtp/`` directory."""
    return f"heads.{index}."


def head_is_moe(model: ModelConfig) -> bool:
    """A parallel head is built like the last decoder layer: MoE unless that layer is dense."""
    return mtp_is_moe(model)


def parallel_head_params(model: ModelConfig, num_heads: int, spec: Optional[Spec] = None) -> list[Param]:
    """The tensors of ``num_heads`` parallel MTP heads (part "mtp")."""
    table: list[Param] = []
    for i in range(num_heads):
        mp, hp = mcore_head_prefix(i), hf_head_prefix(i)
        table += _params_for_layer(mp + "transformer_layer.", hp, head_is_moe(model), model, "mtp", spec)
        table.append(Param(mp + HEAD_NORM.mcore, (hp + HEAD_NORM.hf[0],), "mtp"))
    return table


def param_table(
    model: ModelConfig, mtp_depth: int, spec: Optional[Spec] = None, mtp_copies: bool = True,
    style: str = "sequential",
) -> list[Param]:
    """Every tensor of ``model`` with ``mtp_depth`` MTP modules (``style`` parallel: heads), in
    checkpoint order: embedding, layers, final norm, head, MTP.

    ``spec=None`` lists the local and TE spellings of fused norms side by side (for reading a
    checkpoint of either kind: keep the ones present); "local"/"te" lists exactly one model's keys.
    """
    table = [Param(EMBEDDING, ("model.embed_tokens.weight",), "main")]
    for i in range(model.num_layers):
        table += _params_for_layer(f"decoder.layers.{i}.", f"model.layers.{i}.", is_moe_layer(model, i), model,
                                   "main", spec)
    table.append(Param(FINAL_NORM, ("model.norm.weight",), "main"))
    if not model.tie_embeddings:
        table.append(Param(OUTPUT_LAYER, ("lm_head.weight",), "main"))
    if style == "parallel":
        return table + parallel_head_params(model, mtp_depth, spec)
    for d in range(mtp_depth):
        n = mtp_hf_layer(model, d)
        mp, hp = mcore_mtp_prefix(d), f"model.layers.{n}."
        if mtp_copies:
            table.append(Param(EMBEDDING, (hp + "embed_tokens.weight",), "mtp", copy=True))
        for rule in _MTP_OWN:
            table.append(Param(mp + rule.mcore, (hp + rule.hf[0],), "mtp"))
        table += _params_for_layer(mp + "transformer_layer.", hp, mtp_is_moe(model), model, "mtp", spec)
        if mtp_copies:
            head = OUTPUT_LAYER if not model.tie_embeddings else EMBEDDING
            table.append(Param(head, (hp + "shared_head.head.weight",), "mtp", copy=True))
    return table


def is_mtp_hf_name(name: str, num_layers: int) -> bool:
    """True for HF tensors of MTP layers (``model.layers.{n}`` with n >= num_hidden_layers)."""
    if not name.startswith("model.layers."):
        return False
    index = name.split(".", 3)[2]
    return index.isdigit() and int(index) >= num_layers


def nextn_name(name: str, num_layers: int) -> Optional[str]:
    """SGLang NextN naming: MTP layer ``num_layers + d`` becomes layer ``d``; embed/head copies drop."""
    if not is_mtp_hf_name(name, num_layers):
        raise ValueError(f"{name} is not an MTP tensor")
    _, _, index, rest = name.split(".", 3)
    if rest.startswith("embed_tokens.") or rest.startswith("shared_head.head."):
        return None
    return f"model.layers.{int(index) - num_layers}.{rest}"


def extra_state_keys(param: Param) -> list[str]:
    """megatron-core ``_extra_state`` object keys that accompany ``param`` in a checkpoint.

    Linear layers (``linear_*``, ``eh_proj``) save one (empty) extra-state object per module; for
    routed experts there is one per global expert, keyed ``shard_{e}_{E}``.
    """
    module, _, leaf = param.mcore.rpartition(".")
    name = module.rsplit(".", 1)[-1]
    if param.copy or leaf != "weight" or not (name.startswith("linear_") or name == "eh_proj"):
        return []
    if param.num_experts:
        return [f"{module}._extra_state/shard_{e}_{param.num_experts}" for e in range(param.num_experts)]
    return [f"{module}._extra_state/shard_0_1"]
