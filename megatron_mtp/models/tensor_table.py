"""What every family's tensor table shares: the rule and parameter types, the DeepSeek-style MoE
and dense MLP, the sequential MTP module's own tensors, the layer kinds, and the table builder.

A family gives only its attention block (``Table(attention=...)``); the MLP blocks and the MTP module
(``enorm``/``hnorm``/``eh_proj``/``shared_head``, HF layer ``num_hidden_layers + d``) are shared (a family
whose layer differs, Gemma 4, subclasses ``Table`` with its own layer rules and keeps the MTP module's), and
so are the parallel heads' keys in the families that build them (``mtp.style`` parallel: DeepSeek-V3 and
Gemma 4; DeepSeek-V3.2, GLM-4.5 and Qwen3-MoE refuse it) (models/README.md).

Keys are the *global* sharded-checkpoint keys (torch_dist ``.metadata``), which do not depend on the
training layout: decoder layers carry their global index in the key (``decoder.layers.N.``), routed
experts are one tensor per layer with a leading global-expert axis (``...experts.experts.linear_fc1
.weight`` of shape [E, 2F, H]), and a TP-sharded SwiGLU fc1 is stored globally as [gate; up] (the
checkpoint factory splits every TP shard into its gate and up halves and places them in the two
global halves). A fused attention projection (megatron-core's ``linear_qkv``) is stored globally as
its TP shards one after the other, each holding whole key/value groups: [group 0: its query heads,
its key head, its value head; group 1: ...]. So a rule is one mcore key <-> one HF name, or <-> HF
names fused on dim 0, optionally repeated over the expert axis: how, its transform says
(models/tensor_transforms.py: ``GatedFusion`` for [gate; up], ``QKVFusion`` for the group-interleaved q, k, v,
``StackedExperts``, ``Copy``, ``Fp32``, ``Int64``; ``Direct`` by default).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Callable, Iterator, Literal, Optional

from megatron_mtp.config.model import ModelConfig
from megatron_mtp.config.moe_layers import MoeLayers  # noqa: F401  (re-exported: the one is-MoE rule)
from megatron_mtp.config.mtp_style import get_style, styles
from megatron_mtp.models.tensor_transforms import DIRECT, GATED, Copy, Fp32, Transform

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
    transform: Transform = DIRECT
    """How the mcore tensor becomes its HF tensor(s) and back (models/tensor_transforms.py)."""

    def numel(self, model: ModelConfig) -> int:
        return math.prod(self.shape(model))

    def param(self, mcore_prefix: str, hf_prefix: str, part: Part, model: ModelConfig) -> Param:
        """This rule's row in a layer (or MTP module, or head) under these prefixes, for ``model``."""
        return Param(mcore_prefix + self.mcore, tuple(hf_prefix + h for h in self.hf), part,
                     num_experts=model.num_experts if self.experts else 0, transform=self.transform.for_model(model))


@dataclass(frozen=True)
class Param:
    """One global megatron-core tensor and the HF tensor(s) it becomes."""

    mcore: str
    hf: tuple[str, ...]
    """One name, or the parts of dim 0 (its transform's: (gate, up), (q, k, v)), per expert when the names
    hold ``{e}``."""
    part: Part
    num_experts: int = 0
    """>0: the mcore tensor has a leading expert axis."""
    transform: Transform = DIRECT
    """How it becomes its HF tensor(s) and back (models/tensor_transforms.py)."""
    linear: Optional[bool] = None
    """Its module is a megatron-core linear, which saves an (empty) ``_extra_state`` object beside its weight
    (``extra_state_keys``); None: told by the module's name. A style's drafter whose linears are named otherwise
    (EAGLE-3's ``fc``, ``lm_head``) says so in its rows."""

    def __post_init__(self) -> None:
        if len(self.hf) != self.transform.parts:
            raise ValueError(f"{self.mcore}: {type(self.transform).__name__} makes {self.transform.parts} HF "
                             f"tensor(s), not {len(self.hf)}")

    @property
    def per_expert(self) -> bool:
        """Routed experts written as one HF tensor per expert (``{e}`` in the names), not stacked."""
        return bool(self.num_experts) and self.transform.per_expert

    def hf_names(self) -> list[str]:
        if not self.per_expert:
            return list(self.hf)
        return [name.format(e=e) for e in range(self.num_experts) for name in self.hf]


def hidden(m: ModelConfig) -> tuple:
    return (m.hidden_size,)


DENSE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm", spec="local"),
    Rule("mlp.linear_fc1.layer_norm_weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm",
         spec="te"),
    Rule("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         lambda m: (2 * m.ffn_hidden_size, m.hidden_size), transform=GATED),
    Rule("mlp.linear_fc2.weight", ("mlp.down_proj.weight",), lambda m: (m.hidden_size, m.ffn_hidden_size)),
)
MOE_MLP = (
    Rule("pre_mlp_layernorm.weight", ("post_attention_layernorm.weight",), hidden, "none", "block_norm"),
    Rule("mlp.router.weight", ("mlp.gate.weight",), lambda m: (m.num_experts, m.hidden_size), "none"),
    Rule("mlp.router.expert_bias", ("mlp.gate.e_score_correction_bias",), lambda m: (m.num_experts,), "none",
         "buffer", transform=Fp32()),
    Rule("mlp.experts.experts.linear_fc1.weight",
         ("mlp.experts.{e}.gate_proj.weight", "mlp.experts.{e}.up_proj.weight"),
         lambda m: (2 * m.moe_ffn_hidden_size, m.hidden_size), experts=True, transform=GATED),
    Rule("mlp.experts.experts.linear_fc2.weight", ("mlp.experts.{e}.down_proj.weight",),
         lambda m: (m.hidden_size, m.moe_ffn_hidden_size), experts=True),
    Rule("mlp.shared_experts.linear_fc1.weight",
         ("mlp.shared_experts.gate_proj.weight", "mlp.shared_experts.up_proj.weight"),
         lambda m: (2 * m.moe_ffn_hidden_size * m.num_shared_experts, m.hidden_size), transform=GATED),
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
    linear = param.linear if param.linear is not None else (
        name.startswith("linear_") or name in ("eh_proj", "pre_projection", "post_projection")
        or module in drafter_output_layers())  # a separate drafter's projections and output table
    if isinstance(param.transform, Copy) or leaf != "weight" or not linear:
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
            yield rule.param(mcore_prefix, hf_prefix, part, model)

    def parallel_head_params(self, model: ModelConfig, num_heads: int, spec: Optional[Spec] = None) -> list[Param]:
        """The tensors of ``num_heads`` parallel MTP heads (part "mtp"); a head is built like the
        sequential MTP layer (mtp_is_moe)."""
        table: list[Param] = []
        for i in range(num_heads):
            mp, hp = mcore_head_prefix(i), hf_head_prefix(i)
            table += self._params_for_layer(mp + "transformer_layer.", hp, mtp_is_moe(model), model, "mtp", spec)
            table.append(HEAD_NORM.param(mp, hp, "mtp", model))
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
                mtp.append(Param(EMBEDDING, (hp + "embed_tokens.weight",), "mtp", transform=Copy()))
            for rule in MTP_OWN:
                mtp.append(rule.param(mp, hp, "mtp", model))
            mtp += self._params_for_layer(mp + "transformer_layer.", hp, mtp_is_moe(model), model, "mtp", spec)
            if mtp_copies:
                head = OUTPUT_LAYER if not model.tie_embeddings else EMBEDDING
                mtp.append(Param(head, (hp + "shared_head.head.weight",), "mtp", transform=Copy()))
        for param in mtp:  # in the family's naming (``mtp_names``): a tensor it names None is not written
            names = tuple(self.mtp_names(name, model.num_layers) for name in param.hf)
            if None not in names:
                table.append(dataclasses.replace(param, hf=names))
        return table
