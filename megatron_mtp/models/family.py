"""A model family, typed: one ``Family`` per folder under models/, registered once.

Every consumer outside the folder (the trainer, ``plan``, the analytic sizes, both conversion
directions, the decoder, the serving notes) reads a family through this one object: nothing outside
a family's folder names a module of it (tests/unit/test_family_folders.py). A family's decoder layer and its
activation inventory are in its folder too (or, for an attention kind several families share, below them:
models/decoding/, models/gqa/). ``model.family`` picks it (``get_family``); a Hugging Face
config.json picks it by ``model_type``, else ``architectures`` (``family_of_hf_config``).

How a family comes in: its package's ``__init__.py`` builds its ``Family`` and calls ``register``; the
installed ones are found through the ``megatron_mtp_families`` entry points (pyproject.toml), so the
list of families is written nowhere else. A family defined in a test or a user's package registers
the same way. Members that need torch or megatron-core are ``lazy`` references (``lazy_object`` for a
class), so naming a family (``--help``, ``plan``, ``convert``'s checks) imports neither.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Callable, Mapping, Optional

from megatron_mtp.config.lazy import lazy, lazy_object
from megatron_mtp.config.model import (
    ModelConfig,
    load_installed_families,
    model_config_class,
    register_model_config,
)
from megatron_mtp.config.mtp_style import family_styles, get_style
from megatron_mtp.errors import UserError
from megatron_mtp.models.tensor_table import Table


@dataclass(frozen=True)
class AttentionShape:
    """What the memory plan, the communication model and the serving checks read of one layer's
    attention (whole-model sizes; the consumers divide by tensor parallelism)."""

    qk_dim: int
    """Query/key width per head (MLA: the no-RoPE plus the RoPE part)."""
    v_dim: int
    """Value width per head."""
    rope_dim: int
    """Rotated dimensions per head (MLA: the decoupled rotary key's, which all heads share)."""
    kv_heads: Optional[int] = None
    """Grouped-query attention's key/value heads (one fused linear_qkv); None: MLA's latent form."""
    q_lora: Optional[int] = None
    """MLA's query down-projection rank (None: full-rank queries, or not MLA)."""
    kv_lora: int = 0
    """MLA's compressed key/value latent width (0: not MLA)."""
    qk_norm: bool = False
    """A norm on each query and key head (saved for the backward)."""
    shares_kv: bool = False
    """The keys are the values (no value projection; Gemma 4's full-attention layers)."""
    index_heads: int = 0
    """DeepSeek Sparse Attention's lightning indexer heads in the layer (0: none, not DSA or a layer that reuses
    an earlier layer's top-k)."""
    index_dim: int = 0
    """Width of one indexer head."""
    index_topk: int = 0
    """DSA: earlier tokens each query's attention reads (0: all of them, dense attention)."""
    index_trains: bool = False
    """DSA: the indexer learns from its KL loss, so its tensors are kept for the backward."""


@dataclass(frozen=True)
class ServingFacts:
    """What the serving engines do with this family's exports (convert/serving.py; read from each
    engine's loader for the family)."""

    transformers_mtp_layers: tuple[int, ...] = ()
    """The layer indices transformers' model class of the family knows as MTP layers (its
    ``_keys_to_ignore_on_load_unexpected``): the releases' one MTP module."""
    engine_facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """engine -> convert/serving.py ``EngineFacts`` fields that differ for this family."""
    mla_head_size: Optional[Callable[[Any], int]] = None
    """MLA's cached width per token of a run config (vLLM's MLA kernels take one size); None: not MLA."""
    nextn_architecture: Optional[str] = None
    """``architectures`` of a NextN-layout mtp/config.json: the SGLang class that loads it (None: the family's
    architecture + "NextN")."""
    index_head_dim: Optional[Callable[[Any], int]] = None
    """The width of a DSA indexer head of a run config (the engines' indexer kernels take one size); None: no
    indexer."""
    notes: tuple[str, ...] = ()
    """Sentences SERVING.md adds for this family."""
    no_fp8_export: Optional[str] = None
    """Why ``--dtype fp8`` is refused (the release format has no FP8 weights); None: DeepSeek's FP8 blocks serve."""


@dataclass(frozen=True)
class Family:
    """One model family: its build, tensor table, sizes, Hugging Face format, decoder layer, activation
    inventory, separate drafter and serving facts; its own config fields and their checks are its
    ``model_config`` class's (``check``, ``MTP_STYLES``). ``cfg`` is a run config (config.Config), ``m`` its
    ``model``."""

    name: str
    """``model.family`` (and the folder name under models/)."""
    title: str
    """How messages and documents name it (e.g. "GLM-4.5/4.6/4.7")."""
    hf_architectures: tuple[str, ...]
    """What exports declare in config.json's ``architectures`` (the first) and imports accept."""
    hf_model_types: tuple[str, ...]
    """config.json ``model_type`` values the family reads (the first is what exports write)."""
    model_config: type
    """Its ModelConfig subclass (the family's own fields; ``model.family`` builds it)."""
    table: Table
    """The tensor table: megatron-core keys, HF names, global shapes, TP splits (models/tensor_table.py)."""
    attention_order: Mapping[bool, tuple[str, ...]]
    """The order megatron-core registers an attention block's parameters in (True: TE spec; ``plan``)."""
    attention_shape: Callable[[ModelConfig], AttentionShape]
    """m -> the attention's widths (plan's activations and traffic, serving's layout checks)."""
    # training: megatron-core objects for one pipeline stage (lazy: they import torch)
    build_transformer_config: Callable[..., Any]
    """(cfg, platform, mtp_loss_scale=0.0, features=None) -> megatron-core's TransformerConfig."""
    build_model: Callable[..., Any]
    """(cfg, transformer_config, platform, vocab_size, pre_process, post_process, vp_stage) -> GPTModel."""
    # analytic sizes
    layer_sizes: Callable[[Any], Any]
    """cfg -> models.sizes.LayerSizes of one decoder layer's blocks."""
    parameter_counts: Callable[[Any, int], dict[str, int]]
    """(cfg, padded_vocab) -> {'main', 'mtp_unique', 'main_active', ...}."""
    training_flops_per_token: Callable[[Any, int, int], float]
    """(cfg, padded_vocab, mtp_layers) -> forward+backward FLOPs per token."""
    kv_cache_elements_per_token: Callable[..., int]
    """(cfg, context=None) -> what one layer caches per decoded token (averaged over the layers; a family with
    sliding-window layers counts what they keep of ``context`` tokens, default training.seq_length)."""
    decode_attention_flops: Callable[[Any, int], float]
    """(cfg, context) -> one decoded token's attention FLOPs over ``context`` cached tokens, one layer (averaged over
    the layers where they differ)."""
    # the Hugging Face format
    to_hf_config: Callable[..., dict[str, Any]]
    """(model, mtp, *, vocab_size, num_nextn_predict_layers, ...) -> config.json (models/<name>/hf_config.py)."""
    from_hf_config: Callable[[Mapping[str, Any], str], tuple[Any, Any, int]]
    """(config.json, where) -> (model config, mtp config, MTP depth in the file)."""
    carry_source_fields: Callable[..., dict[str, Any]]
    """What an export carries back of an imported model's config.json (models/hf_common.py)."""
    hf_view: Callable[[Mapping[str, Any], str], Any]
    """(config.json, where) -> the typed view the importer and the decoder read (models/hf_common.HFView)."""
    # the decoder and the memory plan (lazy: they import torch, or what only plan reads)
    decoder_layer: Callable[[], type]
    """() -> the decoder's layer class (inference/decoder.py): a shared one around an attention kind
    (models/decoding/mla.py, gqa.py) or the family's own (models/<name>/decoder.py)."""
    saved_layer: Callable[..., Any]
    """(dims, kernels, recompute modules, moe, grouped_gemm) -> what one decoder layer saves for the backward without
    full recompute (models/saved_activations.Saved; plan/activations.py): its attention kind's inventory
    (models/<name>/activations.py, models/gqa/activations.py)."""
    serving: ServingFacts = ServingFacts()
    """What vLLM, SGLang and transformers do with its exports."""
    export_names: Optional[Callable[[str], str]] = None
    """A text-model tensor name -> its name in the family's multimodal checkpoint (``to-hf --multimodal-from``)."""
    multimodal_config: Optional[Callable[[Mapping[str, Any], Mapping[str, Any]], dict]] = None
    """(the multimodal config.json, the text model's) -> the multimodal config.json with this text model."""
    layer_attention_shape: Optional[Callable[[ModelConfig, Optional[int]], AttentionShape]] = None
    """(m, decoder layer index, None for an MTP layer) -> that layer's attention widths, for a family whose layers
    differ (``attention_shape`` is then its common kind's); None: every layer is ``attention_shape``."""
    mtp_kv_cache_elements_per_token: Optional[Callable[..., float]] = None
    """(cfg, context=None) -> what the drafting MTP layer caches per decoded token, for a family where it differs from
    the decoder layers' average (DSA: its own indexer's key); None: ``kv_cache_elements_per_token``."""
    decodes: bool = True
    """Whether the decoder (``generate``) runs it; false where its decoder layer refuses (the DSA families)."""
    attention_costs: Optional[Callable[[Any], Mapping[str, Any]]] = None
    """cfg -> a sparse attention's training FLOPs per token beside dense attention's for the same model (``plan``;
    models/dsa/sizes.py); None: the attention is dense."""
    style_parts: Mapping[str, Any] = field(default_factory=dict)
    """MTP style name -> what the family gives that style beyond its MTP layer spec (the style's ``family_part`` of
    the package the family names: the assistant style's is its separate drafter,
    mtp_styles/assistant/family_part.py)."""
    import_names: Optional[Callable[[Mapping[str, Any]], Optional[Callable[[str], Optional[str]]]]] = None
    """config.json -> how the importer renames a file's tensors to the text model's names (None: a tensor it
    leaves out, as a multimodal checkpoint's towers), or None where the names are the text model's already."""

    def style_part(self, style: str) -> Any:
        """What the family gives MTP style ``style`` (``style_parts``), or None where it gives nothing."""
        return self.style_parts.get(style)

    def param_table(self, model: ModelConfig, mtp_depth: int, spec=None, mtp_copies: bool = True,
                    style: str = "sequential"):
        """Every tensor of ``model`` in checkpoint order (models/tensor_table.Table.param_table)."""
        return self.table.param_table(model, mtp_depth, spec, mtp_copies, style)

    def layer_rules(self, model: ModelConfig, moe: bool, spec):
        return self.table.layer_rules(model, moe, spec)

    @property
    def mtp_styles(self) -> tuple[str, ...]:
        """The ``mtp.style`` values it builds: its model config's ``MTP_STYLES``, then every style that works for any
        family (config/mtp_style.py ``family_styles``)."""
        return family_styles(self.model_config.MTP_STYLES)

    @property
    def supports_a2a_overlap(self) -> bool:
        """Whether megatron-core's overlapped MoE schedule (parallel.moe_a2a_overlap) computes its layer (its model
        config's ``NO_A2A_OVERLAP`` says why not; config/validate.py refuses the run with it)."""
        return self.model_config.NO_A2A_OVERLAP is None

    @property
    def recompute_modules(self) -> tuple[str, ...]:
        """``recompute.modules`` names only this family has (its model config's ``RECOMPUTE_MODULES``)."""
        return self.model_config.RECOMPUTE_MODULES

    @property
    def architecture(self) -> str:
        """What an export's config.json declares."""
        return self.hf_architectures[0]


_REGISTRY: dict[str, Family] = {}


def family_of_modules(*, name: str, title: str, architectures: tuple[str, ...], model_types: tuple[str, ...],
                      model_config: type, builders: str, sizes: ModuleType, hf_mapping: ModuleType,
                      hf_config: ModuleType, hf_view: ModuleType, decoder: str, activations: str,
                      serving: ServingFacts, style_packages: Optional[Mapping[str, str]] = None,
                      decodes: bool = True) -> Family:
    """A Family from the modules a family folder holds, each with the names the Family reads: ``sizes``
    (attention_shape, layer_sizes, parameter_counts, training_flops_per_token, kv_cache_elements_per_token,
    decode_attention_flops), ``hf_mapping`` (TABLE, ATTENTION_ORDER), ``hf_config`` (to_hf_config,
    from_hf_config, carry_source_fields), ``hf_view`` (parse_hf_config); ``builders`` is the package
    whose ``transformer_config`` and ``model`` modules build it on megatron-core, ``decoder`` the decoder's
    layer class ("package.module:Class"), ``activations`` the module whose ``saved_layer`` is its activation
    inventory, ``style_packages`` MTP style name -> the package in the folder that style reads what the family
    gives it from (its ``family_part``: the assistant's drafter), ``decodes`` whether ``generate`` runs it; all
    load when first used, but the drafter's config.json module."""
    parts = {name: get_style(name).family_part(package) for name, package in (style_packages or {}).items()}
    return Family(
        name=name,
        title=title,
        hf_architectures=architectures,
        hf_model_types=model_types,
        model_config=model_config,
        table=hf_mapping.TABLE,
        attention_order=hf_mapping.ATTENTION_ORDER,
        attention_shape=sizes.attention_shape,
        build_transformer_config=lazy(f"{builders}.transformer_config:build_transformer_config"),
        build_model=lazy(f"{builders}.model:build_model"),
        layer_sizes=sizes.layer_sizes,
        parameter_counts=sizes.parameter_counts,
        training_flops_per_token=sizes.training_flops_per_token,
        kv_cache_elements_per_token=sizes.kv_cache_elements_per_token,
        decode_attention_flops=sizes.decode_attention_flops,
        to_hf_config=hf_config.to_hf_config,
        from_hf_config=hf_config.from_hf_config,
        carry_source_fields=hf_config.carry_source_fields,
        hf_view=hf_view.parse_hf_config,
        decoder_layer=lazy_object(decoder),
        saved_layer=lazy(f"{activations}:saved_layer"),
        serving=serving,
        import_names=getattr(hf_config, "import_names", None),
        export_names=getattr(hf_config, "export_names", None),
        multimodal_config=getattr(hf_config, "multimodal_config", None),
        layer_attention_shape=getattr(sizes, "layer_attention_shape", None),
        mtp_kv_cache_elements_per_token=getattr(sizes, "mtp_kv_cache_elements_per_token", None),
        decodes=decodes,
        attention_costs=getattr(sizes, "attention_costs", None),
        style_parts=parts,
    )


def register(family: Family) -> Family:
    """Add ``family`` (once per name); its ModelConfig class becomes what ``model.family=<name>`` builds."""
    known = _REGISTRY.get(family.name)
    if known is not None and known is not family:
        raise RuntimeError(f"model family {family.name} is registered twice")
    _REGISTRY[family.name] = family
    register_model_config(family.name, family.model_config)
    return family


def families() -> tuple[Family, ...]:
    """Every family installed or registered, by name."""
    load_installed_families()
    return tuple(_REGISTRY[name] for name in sorted(_REGISTRY))


def get_family(name: str) -> Family:
    """The family ``model.family=name`` picks; one sentence naming the families otherwise."""
    load_installed_families()
    if name not in _REGISTRY:
        model_config_class(name)  # raises the UserError naming the families
        raise UserError(f"model.family '{name}' has a config class but no registered family")
    return _REGISTRY[name]


def hf_family(raw: Any) -> Optional[Family]:
    """The family a Hugging Face config.json dict declares: by its ``model_type``, or, in a file
    without one, by its ``architectures``; None for any other."""
    if not hasattr(raw, "get"):
        return None
    model_type, architectures = raw.get("model_type"), raw.get("architectures") or ()
    for family in families():
        if model_type in family.hf_model_types or (
                model_type is None and any(a in family.hf_architectures for a in architectures)):
            return family
    return None


def assistant_family(raw: Any) -> Optional[Family]:
    """The family whose separate drafter a config.json dict describes (its ``model_type``); None for any other."""
    model_type = raw.get("model_type") if hasattr(raw, "get") else None
    return next((f for f in families() if model_type is not None
                 and model_type in {getattr(p, "model_type", None) for p in f.style_parts.values()}), None)


def supported_text(decoding: bool = False) -> str:
    """The families as messages list them: "DeepSeek-V3 (model_type deepseek_v3) and ..."; ``decoding``: only
    those the decoder runs (``Family.decodes``)."""
    names = [f"{f.title} (model_type {f.hf_model_types[0]})" for f in families() if f.decodes or not decoding]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def family_of_hf_config(raw: Any, where: str = "config.json") -> Family:
    """The family that reads a Hugging Face config.json dict (``hf_family``); one sentence otherwise."""
    family = hf_family(raw)
    if family is None:
        model_type = raw.get("model_type") if hasattr(raw, "get") else None
        architectures = list(raw.get("architectures") or []) if hasattr(raw, "get") else []
        raise UserError(f"{where}: model_type {model_type!r} (architectures {architectures}) is not a model family "
                        f"megatron-mtp reads; it reads {supported_text()}")
    return family
