"""Model architecture: the fields every model family shares (size, MoE routing, misc) and the MTP block.

A family's own fields (DeepSeek-V3's MLA and YaRN, GLM-4.5's grouped-query attention) live in its
folder, in a subclass of ModelConfig (``models/<family>/model_config.py``); ``model.family`` picks the
class, so the YAML stays one flat ``model:`` section and a field of another family is one error.
Families come in through the ``megatron_mtp_families`` entry points (pyproject.toml; importing one
registers its class here) or ``models.family.register`` in the same process.

Names follow the DeepSeek-V3 paper / HF config where they differ from megatron-core, and the
mapping to megatron-core's TransformerConfig lives in models/megatron_config.py and each family's
transformer_config.py.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Literal, Mapping, Optional

from megatron_mtp.config.base import to_dict
from megatron_mtp.config.moe_layers import MoeLayers
from megatron_mtp.config.mtp_style import get_style, styles
from megatron_mtp.errors import UserError

DEFAULT_FAMILY = "deepseek_v3"
ENTRY_POINT_GROUP = "megatron_mtp_families"
"""The entry-point group a model family is installed under; loading an entry point registers the family."""

_CLASSES: dict[str, type] = {}
_installed_loaded = False


def register_model_config(family: str, cls: type) -> None:
    """Make ``cls`` (a ModelConfig subclass holding the family's own fields) what ``model.family=family``
    builds (models.family.register calls this)."""
    if not (isinstance(cls, type) and issubclass(cls, ModelConfig)):
        raise TypeError(f"the model config of family {family} must subclass config.model.ModelConfig")
    _CLASSES[family] = cls


def load_installed_families() -> None:
    """Import every installed family once (the ``megatron_mtp_families`` entry points)."""
    global _installed_loaded
    if _installed_loaded:
        return
    _installed_loaded = True
    from importlib.metadata import entry_points

    for entry in entry_points(group=ENTRY_POINT_GROUP):
        entry.load()


def model_config_classes() -> dict[str, type]:
    """family name -> its ModelConfig class, for every family installed or registered."""
    load_installed_families()
    return dict(_CLASSES)


def model_config_class(family: Any, where: str = "model.family") -> type:
    """The ModelConfig class of ``family``; a UserError naming the families otherwise."""
    classes = model_config_classes()
    if not classes:
        raise UserError(f"no model family is installed (the {ENTRY_POINT_GROUP} entry points are missing); "
                        "reinstall megatron-mtp (tools/setup_env.sh, or pip install -e .)")
    if family not in classes:
        raise UserError(f"{where} is {family!r}, which is not a model family here; use one of "
                        f"{', '.join(sorted(classes))}")
    return classes[family]


def default_model_config() -> "ModelConfig":
    """The default family's model config (a new Config's ``model``)."""
    return model_config_class(DEFAULT_FAMILY)()


def _owners(key: str) -> list[tuple[str, type]]:
    """(family, class) of every family whose model config has a field ``key``."""
    return [(name, c) for name, c in sorted(model_config_classes().items())
            if key in {f.name for f in dataclasses.fields(c)}]


@dataclass(frozen=True)
class Growth:
    """How a model takes another family's checkpoint (ModelConfig.grows_from): every tensor is the checkpoint's
    but those ``fresh`` names, which keep their initial weights."""

    fresh: Callable[[str], bool]
    """Whether a parameter (its name or checkpoint key) is new to this family (not in the checkpoint)."""
    checkpoint_key: Callable[[str], str]
    """This model's checkpoint key -> the key of the same tensor in the other family's checkpoint."""


@dataclass
class ModelConfig:
    family: str = DEFAULT_FAMILY
    """Model family (models/<family>/): its layers, tensor names, Hugging Face format and its own fields
    (deepseek_v3: MLA and YaRN; deepseek_v32: those and the lightning indexer; glm4_moe, qwen3_moe: grouped-query
    attention; gemma4: its layer kinds; ``train --help-config`` lists them under the family's name). Every family
    shares the fields here and the MoE and MTP ones.
    Recorded in every checkpoint; a resume can't change it. models/README.md says how a family is added."""
    num_layers: int = 4
    """Number of main-model decoder layers (MTP layers are extra, see mtp.num_layers)."""
    hidden_size: int = 128
    """Model width d."""
    ffn_hidden_size: int = 384
    """Intermediate size of the dense (first-k) layers' SwiGLU MLP."""
    num_attention_heads: int = 4
    """Attention heads."""
    vocab_size: Optional[int] = None
    """Vocabulary size; null takes it from the tokenizer (then padded, see make_vocab_size_divisible_by)."""
    make_vocab_size_divisible_by: int = 64
    """Pad the embedding/output rows to a multiple of this times tensor parallel size."""
    max_position_embeddings: int = 4096
    """Largest position the model is meant to serve (recorded in exported configs)."""
    rope_theta: float = 10000.0
    """RoPE base."""
    # --- MoE
    num_experts: int = 8
    """Routed experts per MoE layer (0: dense model)."""
    first_k_dense: int = 1
    """The first k decoder layers use a dense MLP instead of MoE (HF first_k_dense_replace)."""
    moe_ffn_hidden_size: int = 96
    """Intermediate size of each routed expert."""
    num_shared_experts: int = 1
    """Shared experts per MoE layer (their combined intermediate size is this × moe_ffn_hidden_size)."""
    router_topk: int = 2
    """Routed experts per token."""
    router_num_groups: Optional[int] = 4
    """Expert groups for group-limited routing (null: no grouping)."""
    router_group_topk: Optional[int] = 2
    """Groups each token may route into (needs router_num_groups)."""
    router_score_function: Literal["sigmoid", "softmax"] = "sigmoid"
    """Router score function; DeepSeek-V3 uses sigmoid."""
    router_topk_scaling_factor: float = 2.5
    """Routed scaling factor applied to the combined top-k weights."""
    router_norm_topk_prob: bool = True
    """Normalise the selected top-k sigmoid scores to sum to one (DeepSeek-V3: true)."""
    router_enable_expert_bias: bool = True
    """Aux-loss-free load balancing: a per-expert bias on routing scores, updated every step."""
    router_bias_update_rate: float = 1.0e-3
    """Step size of the expert-bias update."""
    aux_loss_coeff: float = 1.0e-4
    """Auxiliary balance loss weight (0 disables it); aux_loss_type says over which tokens."""
    aux_loss_type: Literal["seq_aux_loss", "aux_loss", "global_aux_loss"] = "seq_aux_loss"
    """Over which tokens the balance loss counts expert loads (megatron-core's
    moe_router_load_balancing_type): seq_aux_loss, each sequence (DeepSeek-V3); aux_loss, each
    micro-batch (the Switch-Transformer loss transformers' Qwen3-MoE and Mixtral compute); global_aux_loss,
    the whole global batch across data-parallel ranks and micro-batches (Qwen3's training report)."""
    moe_capacity_factor: Optional[float] = None
    """Token dropping: each expert takes at most capacity_factor × (tokens × router_topk / num_experts) of a
    micro-batch's tokens and drops the rest (GShard, Switch; megatron-core's moe_expert_capacity_factor). null:
    no dropping (DeepSeek-V3). The dropped share is logged as moe/dropped_tokens, per layer moe/dropped/layer_NN."""
    moe_token_drop_policy: Literal["probs", "position"] = "probs"
    """Which tokens an expert over capacity keeps: probs, those with the highest routing probability;
    position, the first in the micro-batch."""
    moe_pad_to_capacity: bool = False
    """Pad every expert's input to its capacity (fixed shapes, e.g. for CUDA graphs; needs moe_capacity_factor)."""
    # --- misc
    norm_epsilon: float = 1.0e-6
    """RMSNorm epsilon."""
    init_method_std: float = 0.02
    """Std of the normal weight initialisation."""
    tie_embeddings: bool = False
    """Share the input embedding with the output head (DeepSeek-V3: false)."""

    MTP_STYLES: ClassVar[tuple[str, ...]] = ("sequential",)
    """The ``mtp.style`` values the family builds that need something of it (a style that works for any family,
    ``MTPStyle.any_family``, is built by every family without being named here)."""
    RECOMPUTE_MODULES: ClassVar[tuple[str, ...]] = ()
    """``recompute.modules`` names only some attentions have (config/performance.py) that the family has."""

    DENSE_MLP_BESIDE_MOE: ClassVar[bool] = False
    """An MoE layer also runs the dense MLP (of ffn_hidden_size) beside its experts (Gemma 4)."""
    NO_A2A_OVERLAP: ClassVar[Optional[str]] = None
    """Why megatron-core's overlapped MoE schedule (parallel.moe_a2a_overlap) would not compute the family's layer
    (a clause; the run is refused with it), or None where it does (models/family.py ``supports_a2a_overlap``)."""

    def attention_input_gathers(self, layer: Optional[int]) -> int:
        """Column-parallel projections that gather the attention's sequence-parallel input in decoder layer
        ``layer`` (None: an MTP layer): one fused projection unless a family splits it (``plan``'s traffic)."""
        return 1

    TRAINING_FIELDS: ClassVar[tuple[str, ...]] = ()
    """The family's own fields that shape no tensor but how it trains: a resume or a checkpoint.load may change
    them, unless they are TRAINED_PART_FIELDS (checkpoint/resume_rules.py)."""
    TRAINED_PART_FIELDS: ClassVar[tuple[str, ...]] = ()
    """Those of TRAINING_FIELDS that pick which parameters train (so what the optimizer state holds): a resume
    may not change them, a new run from the weights (checkpoint.load) may."""

    def trains(self, name: str) -> bool:
        """Whether the parameter ``name`` (or its checkpoint key) takes gradients as far as the model's own fields
        say (a training stage may freeze some; mtp.freeze_base is the MTP config's)."""
        return True

    def grows_from(self, family: str) -> Optional[Growth]:
        """How a checkpoint.load of a checkpoint of another family ``family`` fills this model (None: it
        cannot; the load is refused)."""
        return None

    def moe_layer_rule(self) -> MoeLayers:
        """Which decoder layers are MoE (config/moe_layers.py): every layer after the first
        ``first_k_dense``; a family with another rule overrides this."""
        return MoeLayers(self.num_layers, self.num_experts, self.first_k_dense)

    def check(self, cfg: Any) -> None:
        """The family's own checks of its fields against the whole run config (its layout included): a
        UserError for the first failure (models/<family>/validate.py)."""

    @classmethod
    def __config_classes__(cls) -> dict[str, type]:
        """Every family's class (``train --help-config`` lists their own fields)."""
        return model_config_classes()

    @classmethod
    def __config_class__(cls, data: Mapping[str, Any], where: str) -> tuple[type, dict[str, Any]]:
        """(the class ``data`` builds, ``data`` without what it may drop): the class of
        ``data['family']``. A key of another family at that family's default is dropped (a
        config.yaml saved before the families' fields were split holds every family's), one set to
        anything else is refused in one sentence."""
        family = data.get("family", DEFAULT_FAMILY)
        target = model_config_class(family, f"{where}.family" if where else "family")
        own = {f.name for f in dataclasses.fields(target)}
        kept = {}
        for key, value in data.items():
            owners = [] if key in own else _owners(key)
            if not owners:
                kept[key] = value  # its own, or unknown everywhere (from_dict names the closest key)
            elif any(to_dict(c())[key] != value for _, c in owners):  # set away from that family's default
                raise UserError(cls.__foreign_key__(key, data, where))
        return target, kept

    @classmethod
    def __foreign_key__(cls, key: str, data: Mapping[str, Any], where: str) -> Optional[str]:
        """The sentence for ``key`` set in a model section of another family (None: no family has it)."""
        owners = _owners(key)
        if not owners:
            return None
        family = data.get("family", DEFAULT_FAMILY)
        names = " or model.family=".join(name for name, _ in owners)
        return (f"{where}.{key} is a field of model.family={names}, not of model.family={family}; "
                f"remove it or set model.family={owners[0][0]}")


@dataclass
class MTPConfig:
    num_layers: int = 1
    """MTP depth D: D modules (style sequential), D heads (style parallel) or D recurrent draft steps of
    one assistant (style assistant) predicting tokens t+2 .. t+1+D (0 disables MTP)."""
    style: str = "sequential"
    """A registered MTP style (mtp_styles/, one folder each), which the model's family builds (its MTP_STYLES, or a
    style for any family); the first is the default. The styles:"""
    repeated_layer: bool = False
    """One MTP module applied mtp.num_layers times (megatron-core 0.19's mtp_use_repeated_layer; refused on
    0.16): depth k reads depth k-1's output and the embedding of token t+k exactly as D modules would, but
    the D depths share one module's weights, gradients and optimizer state. Style sequential only.
    Checkpoints hold that one module (``mtp.layers.0``); exports write it as one MTP layer
    (``num_nextn_predict_layers: 1``) and SERVING.md asks for D draft tokens, which vLLM and SGLang draw
    by applying the one module again, as `generate --speculative D` does."""
    init: Literal["random", "copy_last_layer"] = "random"
    """MTP modules or parallel heads a checkpoint.load (weights only) does not hold, e.g. of a model imported
    without MTP: drawn at random like a new run's, or their transformer layer copied from the checkpoint's
    last decoder layer (their norms and eh_proj are new either way)."""
    freeze_base: Optional[bool] = None
    """Train only the MTP modules, heads or assistant on a frozen main model (needs checkpoint.load and mtp.num_layers
    > 0; parallel heads without head_by_head_backward). null: true for style assistant, which always trains so
    (false is refused there), false otherwise. Frozen: every other parameter, the shared embedding and output head
    included, gets no gradient, no optimizer state and no place in the DDP buckets; the main model runs forward only
    (no saved activations; pipeline stages without an MTP layer do no backward at all) and its weights, router
    expert biases included, are saved exactly as loaded. Gradients are reduced once after the last micro-batch
    (parallel.overlap_grad_reduce / overlap_param_gather do not apply: there is no base backward to overlap with). A
    new run loads only the weights of checkpoint.load (its optimizer state and progress belong to other parameters,
    whatever checkpoint.load_optimizer says); resuming the run's own checkpoint restores everything.
    training/README.md, "Frozen base"."""
    targets: Literal["tokens", "self", "mix"] = "tokens"
    """What MTP depth k at position i learns: tokens, the data token i+1+k (cross-entropy); self, the main
    model's own next-token distribution at position i+k from the same forward (detached,
    temperature-scaled by self_temperature; cross-entropy to it, i.e. KL plus the teacher's entropy),
    which is what a greedy verifier accepts; mix, (1 - self_weight)·tokens + self_weight·self."""
    self_weight: float = 0.5
    """With targets=mix: the weight of the self-distillation term (0..1)."""
    self_temperature: float = 1.0
    """With targets self or mix: temperature T of the main model's distribution softmax(logits / T)."""
    head_by_head_backward: bool = False
    """Style parallel: forward and backward one head at a time through the detached trunk output
    (Gloeckle et al.'s memory-saving order), so one head's activations and logits are alive at a time."""
    loss_weight_schedule: list[tuple[int, float]] = field(default_factory=lambda: [(0, 0.3)])
    """λ by consumed training tokens: [[tokens, λ], ...]; λ of the last entry whose start ≤ tokens
    consumed applies. DeepSeek-V3: [[0, 0.3], [10e12, 0.1]]. The objective is lm + (λ/D)·Σ_d CE_d."""

    @staticmethod
    def field_help() -> dict[str, str]:
        """``train --help-config``'s words on the registered styles (config/base.py ``describe``)."""
        return {"style": "; ".join(s.name + (f": {s.summary}" if s.summary else "") for s in styles()) + "."}

    def __new__(cls, *args, **kwargs):
        """``MTPConfig(...)`` builds ``mtp_config_class()``: every MTP config has the styles' option sections."""
        return object.__new__(mtp_config_class() if cls is MTPConfig else cls)

    @classmethod
    def __config_class__(cls, data: Mapping[str, Any], where: str) -> tuple[type, dict[str, Any]]:
        """(the class an ``mtp`` mapping builds, the mapping): MTPConfig with each style's option section
        (``mtp_config_class``)."""
        return mtp_config_class(), dict(data)

    @classmethod
    def __config_sections__(cls) -> dict[str, tuple[type, str]]:
        """section -> (its class, the setting it belongs to): each style's options (``train --help-config``)."""
        return {name: (options, f"mtp.style={name}") for name, options in _style_options()}

    def __post_init__(self):
        style = get_style(self.style)
        if self.freeze_base is None:  # a separate drafter always trains beside a frozen target
            self.freeze_base = style.separate_drafter

    @property
    def modules(self) -> int:
        """How many MTP modules hold weights: 1 with repeated_layer, else num_layers (the depth)."""
        return min(self.num_layers, 1) if self.repeated_layer else self.num_layers


def _style_options() -> tuple[tuple[str, type], ...]:
    """(style name, its options class) of every registered style that has options of its own."""
    return tuple((style.name, style.options()) for style in styles() if style.options is not None)


@functools.lru_cache(maxsize=None)
def _with_sections(sections: tuple[tuple[str, type], ...]) -> type:
    own = {f.name for f in dataclasses.fields(MTPConfig)}
    clash = [name for name, _ in sections if name in own]
    if clash:
        raise RuntimeError(f"MTP style {clash[0]} has options, whose section would be the field mtp.{clash[0]}")
    if not sections:
        return MTPConfig
    made = dataclasses.make_dataclass("MTPConfig", [(name, options, field(default_factory=options))
                                                    for name, options in sections], bases=(MTPConfig,))
    made.__module__, made.__doc__ = __name__, MTPConfig.__doc__
    return made


def mtp_config_class() -> type:
    """MTPConfig with a section ``mtp.<style>`` of each registered style's ``options`` class (config/mtp_style.py),
    the styles' own option sections: the class the config loader and ``MTPConfig(...)`` build for ``mtp`` (the
    registry is read when the first is built, not when this module is imported)."""
    return _with_sections(_style_options())
