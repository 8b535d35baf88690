"""What every family's tensor table shares: the rule and parameter types, the DeepSeek-style MoE
and dense MLP, the sequential MTP module's own tensors, the layer kinds, and the table builder.

A family gives only its attention block (``Table(attention=...)``); the MLP blocks and the MTP module
(``enorm``/``hnorm``/``eh_proj``/``shared_head``, HF layer ``num_hidden_layers + d``) are shared (a family
whose layer differs, Gemma 4, subclasses ``Table`` with its own layer rules and keeps the MTP module's), and
so are the parallel heads' keys in the families that build them (``mtp.style`` parallel: DeepSeek-V3 and
Gemma 4; GLM-4.5 and Qwen3-MoE refuse it) (models/README.md).

Keys are the *global* sharded-checkpoint keys (torch_dist ``.metadata``), which do not depend on the
training layout: decoder layers carry their global index in the key (``decoder.layers.N.``), routed
experts are one tensor per layer with a leading global-expert axis (``...experts.experts.linear_fc1
.weight`` of shape [E, 2F, H]), and a TP-sharded SwiGLU fc1 is stored globally as [gate; up] (the
checkpoint factory splits every TP shard into its gate and up halves and places them in the two
global halves). A fused attention projection (megatron-core's ``linear_qkv``) is stored globally as
its TP shards one after the other, each holding whole key/value groups: [group 0: its query heads,
its key head, its value head; group 1: ...]. So a rule is one mcore key <-> one HF name, or <-> HF
names fused on dim 0 (``fuse``: "concat" for [gate; up], "qkv" for the group-interleaved q, k, v),
optionally repeated over the expert axis.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Optional, Sequence

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.config.moe_layers import MoeLayers  # noqa: F401  (re-exported: the one is-MoE rule)
from megatron_mtp.config.mtp_style import get_style, styles

Part = Literal["main", "mtp"]
Spec = Literal["local", "te"]
Shape = Callable[[ModelConfig], tuple]
Split = Literal["tp", "none", "local"]
Role = Literal["weight", "norm", "block_norm", "buffer"]
Fuse = Literal["concat", "qkv"]


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
    fuse: Fuse = "concat"
    """How several HF names make the one mcore tensor (dim 0): "concat" in equal parts, "qkv"
    interleaved per key/value group (``Param.qkv``)."""
    stacked: bool = False
    """Routed experts in one HF tensor with a leading expert axis (Gemma 4's ``experts.gate_up_proj``),
    not one HF tensor per expert."""

    def numel(self, model: ModelConfig) -> int:
        return math.prod(self.shape(model))


@dataclass(frozen=True)
class Param:
    """One global megatron-core tensor and the HF tensor(s) it becomes."""

    mcore: str
    hf: tuple[str, ...]
    """One name, or the parts of dim 0: (gate, up) halves, or (q, k, v) when ``qkv`` is set
    (per expert when num_experts > 0)."""
    part: Part
    num_experts: int = 0
    """>0: the mcore tensor has a leading expert axis and the HF names hold ``{e}``."""
    keep_fp32: bool = False
    """Stored in fp32 even in a bf16 export (the router's e_score_correction_bias)."""
    copy: bool = False
    """An MTP copy of the main embedding/head: written on export, not read back on import."""
    qkv: Optional[tuple[int, int, int]] = None
    """(key/value groups, query heads per group, head dim) of a fused q/k/v projection."""
    stacked: bool = False
    """With ``num_experts``: the HF tensor holds every expert along its first axis, as the mcore one does."""
    integer: bool = False
    """An integer buffer (an assistant's ``token_ordering``): written and read as int64, never cast."""

    @property
    def per_expert(self) -> bool:
        """Routed experts written as one HF tensor per expert (``{e}`` in the names), not stacked."""
        return bool(self.num_experts) and not self.stacked

    def hf_names(self) -> list[str]:
        if not self.per_expert:
            return list(self.hf)
        return [name.format(e=e) for e in range(self.num_experts) for name in self.hf]

    def part_rows(self, rows: int) -> list[int]:
        """Rows (dim 0) of each HF tensor, for an mcore tensor (one expert's) of ``rows`` rows."""
        if self.qkv is None:
            return [rows // len(self.hf)] * len(self.hf)
        groups, per_group, head = self.qkv
        return [groups * per_group * head, groups * head, groups * head]

    def split(self, tensor):
        """The HF tensors of one mcore tensor (one expert's), in ``hf`` order."""
        if len(self.hf) == 1:
            return [tensor]
        if self.qkv is None:
            return list(tensor.chunk(len(self.hf), dim=0))
        groups, per_group, head = self.qkv
        grouped = tensor.reshape(groups, per_group + 2, head, *tensor.shape[1:])
        rest = tuple(tensor.shape[1:])
        q, k, v = grouped.split([per_group, 1, 1], dim=1)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]

    def join(self, parts: Sequence):
        """The inverse of ``split``: one mcore tensor from its HF tensors."""
        import torch

        if len(parts) == 1:
            return parts[0]
        if self.qkv is None:
            return torch.cat(list(parts), dim=0)
        groups, per_group, head = self.qkv
        q, k, v = parts
        rest = tuple(q.shape[1:])
        grouped = torch.cat([q.reshape(groups, per_group, head, *rest), k.reshape(groups, 1, head, *rest),
                             v.reshape(groups, 1, head, *rest)], dim=1)
        return grouped.reshape(-1, *rest)


def hidden(m: ModelConfig) -> tuple:
    return (m.hidden_size,)


DENSE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm", spec="local"),
    Rule("mlp.linear_fc1.layer_norm_weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm",
         spec="te"),
    Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         lambda m: (2 * m.ffn_hidden_size, m.hidden_size)),
    Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), lambda m: (m.hidden_size, m.ffn_hidden_size)),
)
MOE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm"),
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
MTP_OWN = (
    Rule("enorm.weight", ("enorm.weight",), hidden, "none", "norm"),
    Rule("hnorm.weight", ("hnorm.weight",), hidden, "none", "norm"),
    Rule("eh_proj.weight", ("eh_proj.weight",), lambda m: (m.hidden_size, 2 * m.hidden_size)),
    Rule("final_layernorm.weight", ("shared_head.norm.weight",), hidden, "none", "norm"),
)
HEAD_NORM = Rule("final_layernorm.weight", ("norm.weight",), hidden, "none", "norm")
"""A parallel MTP head's own final norm."""

EMBEDDING = "embedding.word_embeddings.weight"
FINAL_NORM = "decoder.final_layernorm.weight"
OUTPUT_LAYER = "output_layer.weight"

MAIN_KEY_PREFIXES = ("embedding.", "decoder.", "output_layer.")
"""Keys of the main model's weights."""


def mtp_key_prefixes() -> tuple[str, ...]:
    """Keys of every MTP style's weights (each style's ``key_prefix``: the sequential MTP block's, the parallel
    heads', a separate drafter's)."""
    return tuple(dict.fromkeys(s.key_prefix for s in styles()))


def model_key_prefixes() -> tuple[str, ...]:
    """Megatron-core keys under these prefixes are model weights; anything else (optimizer state, RNG,
    ``_extra_state`` objects) is never read by the converter."""
    return MAIN_KEY_PREFIXES + mtp_key_prefixes()


def drafter_output_layers() -> tuple[str, ...]:
    """The modules of the separate drafters' own output tables (``<key_prefix>output_layer``)."""
    return tuple(s.key_prefix + "output_layer" for s in styles() if s.separate_drafter)


def moe_layers(model: ModelConfig) -> MoeLayers:
    """The MoE layers of a run's model (its family's rule: ``ModelConfig.moe_layer_rule``)."""
    return model.moe_layer_rule()


def is_moe_layer(model: ModelConfig, index: int) -> bool:
    """Decoder layer ``index`` (0-based) has a routed MLP (``moe_layers``)."""
    return index in moe_layers(model)


def moe_layer_count(model: ModelConfig) -> int:
    """How many decoder layers are MoE."""
    return moe_layers(model).count


def mtp_is_moe(model: ModelConfig) -> bool:
    """The MTP layers and parallel heads have a routed MLP: the model's MoE-layer rule at the index the
    serving engines build them at (config/moe_layers.py; models/megatron_specs.py builds them so)."""
    return moe_layers(model).mtp


def mtp_own_rules() -> tuple[Rule, ...]:
    """What a sequential MTP module holds besides its transformer layer."""
    return MTP_OWN


def mtp_hf_layer(model: ModelConfig, depth: int) -> int:
    """HF layer index of MTP module ``depth``."""
    return model.num_layers + depth


def mcore_mtp_prefix(depth: int) -> str:
    return f"mtp.layers.{depth}."


def mcore_head_prefix(index: int) -> str:
    """megatron-core prefix of parallel head ``index`` (0-based)."""
    return f"mtp_heads.layers.{index}."


def hf_head_prefix(index: int) -> str:
    """Name prefix of parallel head ``index`` in its exported ``mtp/`` directory."""
    return f"heads.{index}."


def release_mtp_name(name: str, num_layers: int) -> Optional[str]:
    """The release naming of MTP tensors (DeepSeek-V3, GLM-4.5): the name itself."""
    return name


def is_mtp_hf_name(name: str, num_layers: int) -> bool:
    """True for HF tensors of MTP layers (``model.layers.{n}`` with n >= num_hidden_layers, or a
    family's ``mtp.*`` naming)."""
    if name.startswith("mtp."):
        return True
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
    linear = name.startswith("linear_") or name in ("eh_proj", "pre_projection", "post_projection") \
        or module in drafter_output_layers()  # a separate drafter's projections and output table
    if param.copy or leaf != "weight" or not linear:
        return []
    if param.num_experts:
        return [f"{module}._extra_state/shard_{e}_{param.num_experts}" for e in range(param.num_experts)]
    return [f"{module}._extra_state/shard_0_1"]


AttentionRules = Callable[[ModelConfig, Optional[Spec]], list[Rule]]


@dataclass(frozen=True)
class Table:
    """A family's tensor table: its attention rules (every rule, and those of one model in one spec)
    around the shared MLP and MTP rules."""

    attention: tuple[Rule, ...]
    """Every attention rule the family knows (``rule_for_key`` looks here)."""
    attention_for: AttentionRules
    """The attention rules of one model, in one spec's spelling (None: both)."""
    qkv: Optional[Callable[[ModelConfig], tuple[int, int, int]]] = None
    """(groups, query heads per group, head dim) of the family's fused q/k/v rules."""
    mtp_names: Callable[[str, int], Optional[str]] = release_mtp_name
    """(release name, num_layers) -> the family's HF name of an MTP tensor (None: not written). The
    release naming (``model.layers.{num_hidden_layers + d}.*``, ``release_mtp_name``) is the default;
    a family whose engines read another naming gives its own (the decoder reads exports through it too)."""

    def layer_rules(self, model: ModelConfig, moe: bool, spec: Optional[Spec]) -> list[Rule]:
        """The tensors of one decoder layer (dense or MoE) of ``model``, in one spec's spelling (None: both)."""
        out = list(self.attention_for(model, spec))
        for rule in MOE_MLP if moe else DENSE_MLP:
            if not model.router_enable_expert_bias and rule.mcore == "mlp.router.expert_bias":
                continue
            if not model.num_shared_experts and rule.mcore.startswith("mlp.shared_experts."):
                continue
            if spec is not None and rule.spec not in (None, spec):
                continue
            out.append(rule)
        return out

    def rules_at(self, model: ModelConfig, prefix: str, moe: bool, spec: Optional[Spec]) -> list[Rule]:
        """The tensors of the layer at megatron-core ``prefix`` (``decoder.layers.N.``, an MTP layer's): its
        ``layer_rules``, unless the family's layers differ by index (GLM-5's layers without an indexer)."""
        return self.layer_rules(model, moe, spec)

    def block_rules(self, model: ModelConfig, block: Literal["attention", "dense_mlp", "moe_mlp"],
                    spec: Optional[Spec]) -> list[Rule]:
        """The tensors of one block of a decoder layer: its attention, or its dense or routed MLP."""
        group = {"attention": self.attention, "dense_mlp": DENSE_MLP, "moe_mlp": MOE_MLP}[block]
        return [r for r in self.layer_rules(model, block == "moe_mlp", spec) if r in group]

    def rule_for_key(self, key: str, model: Optional[ModelConfig] = None) -> Rule:
        """The rule of a global megatron-core key (any layer, MTP module or head); KeyError if none. A
        family whose layers differ by index reads ``model`` to tell which layer the key names."""
        for rule in (*self.attention, *DENSE_MLP, *MOE_MLP, *MTP_OWN):
            if key.endswith("." + rule.mcore):
                return rule
        raise KeyError(key)

    def _params_for_layer(self, mcore_prefix: str, hf_prefix: str, moe: bool, model: ModelConfig, part: Part,
                          spec: Optional[Spec]) -> Iterator[Param]:
        for rule in self.rules_at(model, mcore_prefix, moe, spec):
            yield Param(
                mcore=mcore_prefix + rule.mcore,
                hf=tuple(hf_prefix + h for h in rule.hf),
                part=part,
                num_experts=model.num_experts if rule.experts else 0,
                keep_fp32=rule.keep_fp32,
                qkv=self.qkv(model) if rule.fuse == "qkv" and self.qkv is not None else None,
                stacked=rule.stacked,
            )

    def parallel_head_params(self, model: ModelConfig, num_heads: int, spec: Optional[Spec] = None) -> list[Param]:
        """The tensors of ``num_heads`` parallel MTP heads (part "mtp"); a head is built like the
        sequential MTP layer (mtp_is_moe)."""
        table: list[Param] = []
        for i in range(num_heads):
            mp, hp = mcore_head_prefix(i), hf_head_prefix(i)
            table += self._params_for_layer(mp + "transformer_layer.", hp, mtp_is_moe(model), model, "mtp", spec)
            table.append(Param(mp + HEAD_NORM.mcore, (hp + HEAD_NORM.hf[0],), "mtp"))
        return table

    def param_table(self, model: ModelConfig, mtp_depth: int, spec: Optional[Spec] = None,
                    mtp_copies: bool = True, style: str = "sequential") -> list[Param]:
        """Every tensor of ``model`` with ``mtp_depth`` MTP depths of ``style`` (the MTP style's ``tensor_rows``:
        modules, heads, or none of the family's own for a separate drafter), in checkpoint order: embedding,
        layers, final norm, head, MTP.

        ``spec=None`` lists the local and TE spellings of fused norms side by side (for reading a
        checkpoint of either kind: keep the ones present); "local"/"te" lists exactly one model's keys.
        """
        table = [Param(EMBEDDING, ("model.embed_tokens.weight",), "main")]
        for i in range(model.num_layers):
            table += self._params_for_layer(f"decoder.layers.{i}.", f"model.layers.{i}.", is_moe_layer(model, i),
                                            model, "main", spec)
        table.append(Param(FINAL_NORM, ("model.norm.weight",), "main"))
        if not model.tie_embeddings:
            table.append(Param(OUTPUT_LAYER, ("lm_head.weight",), "main"))
        return table + get_style(style).tensor_rows(self, model, mtp_depth, spec, mtp_copies)

    def mtp_module_params(self, model: ModelConfig, mtp_depth: int, spec: Optional[Spec] = None,
                          mtp_copies: bool = True) -> list[Param]:
        """The rows of ``mtp_depth`` sequential MTP modules (``mtp_copies``: with the copies of the embedding and
        the output head the release format writes per module), in the family's naming."""
        table: list[Param] = []
        mtp: list[Param] = []
        for d in range(mtp_depth):
            n = mtp_hf_layer(model, d)
            mp, hp = mcore_mtp_prefix(d), f"model.layers.{n}."
            if mtp_copies:
                mtp.append(Param(EMBEDDING, (hp + "embed_tokens.weight",), "mtp", copy=True))
            for rule in MTP_OWN:
                mtp.append(Param(mp + rule.mcore, (hp + rule.hf[0],), "mtp"))
            mtp += self._params_for_layer(mp + "transformer_layer.", hp, mtp_is_moe(model), model, "mtp", spec)
            if mtp_copies:
                head = OUTPUT_LAYER if not model.tie_embeddings else EMBEDDING
                mtp.append(Param(head, (hp + "shared_head.head.weight",), "mtp", copy=True))
        for param in mtp:  # in the family's naming (``mtp_names``): a tensor it names None is not written
            names = tuple(self.mtp_names(name, model.num_layers) for name in param.hf)
            if None not in names:
                table.append(dataclasses.replace(param, hf=names))
        return table
