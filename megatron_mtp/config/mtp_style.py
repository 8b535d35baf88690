"""An MTP style, typed: one ``MTPStyle`` per folder under mtp_styles/, registered once.

``mtp.style`` picks one (``get_style``). Every consumer outside the folder (the config checks, a family's model
build, the tensor rows, ``plan``, the analytic sizes, the checkpoints' resume rules, conversion, the decoder) asks
the style what it does instead of comparing its name: its traits (``chains_modules``, ``separate_drafter``, ...)
answer the yes/no questions, its members do the rest. Members that need torch, megatron-core or a package above
this one are ``lazy`` references (config/lazy.py), so registering a style imports none of them.

How a style comes in: the folders sit at the top of the package's layers (mtp_styles/, above inference: a style's
own modules may use any package), so nothing below names them; ``BUILT_IN`` lists their names and the registry
imports ``megatron_mtp.mtp_styles.<name>`` by that name when a style is first asked for, as config/model.py loads the
families through their entry points. A style's ``__init__.py`` imports only this module and config/lazy.py, so
naming a style imports no torch. A style defined in a test or another package calls ``register_style`` itself.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Optional

from megatron_mtp.errors import UserError

BUILT_IN = ("sequential", "parallel", "assistant", "eagle3")
"""The folders of mtp_styles/, in the order messages list them (the first is mtp.style's default): adding a style
is its folder and its name here."""
STYLES_PACKAGE = "megatron_mtp" + ".mtp_styles"
"""Where the built-in styles' folders are (loaded by name: the layers above do not reach down to it)."""


@dataclass(frozen=True)
class FamilyParts:
    """What a family gives the styles it builds (its model.py, for one pipeline stage)."""

    mtp_layer_spec: Callable[[], Any]
    """() -> the layer spec of one MTP layer of the family (a parallel head is one such layer)."""
    drafter_model: Optional[Callable[[], type]] = None
    """() -> the GPTModel subclass that trains the family's separate drafter (None: it has none)."""


def _no_checks(cfg: Any) -> None:
    """A style with no checks of its own."""


@dataclass(frozen=True)
class MTPStyle:
    """One MTP design: what a run with ``mtp.style=<name>`` and ``mtp.num_layers > 0`` builds, checks, counts, saves,
    exports and drafts with. ``cfg`` is a run config (config.Config), ``mtp`` its ``mtp`` section."""

    name: str
    """``mtp.style`` (and the folder name under mtp_styles/)."""
    chains_modules: bool
    """Depth k reads depth k-1's hidden state and the embedding of token t+k (DeepSeek-V3's MTP block inside
    megatron-core's GPTModel): the MTP stage keeps a copy of the input embedding, each module has an eh_proj, one
    module may serve every depth (mtp.repeated_layer), full recompute reaches the MTP layers."""
    separate_drafter: bool
    """A model of its own (its own widths and tensors) trained on the frozen target: mtp.freeze_base defaults to
    true and cannot be false, the target's export says no MTP layer, the drafter is exported to its own
    directory."""
    soft_targets: bool
    """It can learn the main model's own distribution (mtp.targets self or mix)."""
    head_by_head: bool
    """Its depths are independent, so their losses may be back-propagated one at a time (mtp.head_by_head_backward)."""
    a2a_overlap: bool
    """megatron-core's overlapped MoE schedule (parallel.moe_a2a_overlap) computes it."""
    context_parallel: bool
    """It works with parallel.context > 1."""
    drafts: bool
    """``plan --speculative`` models its speculative decoding."""
    words: Callable[[Any], str]
    """mtp -> how messages name a run's MTP part (e.g. "2 sequential MTP modules")."""
    key_prefix: str
    """The checkpoint-key prefix of everything it holds (``parts`` divide it): what drop-mtp removes, what trains on
    a frozen base, what an export calls MTP weights (models/tensor_table.py ``mtp_key_prefixes``). A separate
    drafter's output table is ``<key_prefix>output_layer``."""
    parts: Callable[[Any], list[str]]
    """mtp -> the checkpoint-key prefixes of its parts, one per module or head (one for a separate drafter)."""
    wrap: Callable[..., Optional[tuple[type, dict]]]
    """(cfg, platform, FamilyParts) -> (the GPTModel subclass, its extra arguments) that replaces megatron-core's MTP
    block, or None where the block stays (the family then gives the block its MTP spec)."""
    tensor_rows: Callable[..., list]
    """(family table, model config, depth, spec, mtp_copies) -> its rows of the family's tensor table
    (models/tensor_table.py), after the main model's: a separate drafter's are its family's drafter table's."""
    own_rules: Callable[[], list]
    """() -> the tensor rules (models/tensor_table.py) of what one MTP module or head holds besides its transformer
    layer (the analytic sizes)."""
    own_flops: Callable[[Any], float]
    """cfg -> forward FLOPs per token of what one module or head computes besides its layer and the output head."""
    plan: Callable[[], Any]
    """() -> its ``plan`` module (mtp_styles/<name>/plan.py): ``params(cfg, sizes, stage, padded_vocab, te)`` its
    parameters registered after GPTModel's own modules, ``saved(cfg, stage, d, k, mods, grouped_gemm,
    head_grad_bytes)`` its (prefix, saved activations) on a stage, ``assumption(cfg)`` its sentence in the plan's
    report (or None), ``draft_step_bytes(cfg, padded_vocab, batch, serve)`` one draft step's reads (a style that
    drafts), ``drafter_tp(cfg, d)`` a separate drafter's tensor-parallel bytes on the loss stage."""
    convert: Callable[[], Any]
    """() -> its ``convert`` module (mtp_styles/<name>/convert.py): ``claims(config.json)`` whether an MTP
    directory is its format (``from-hf``), ``import_depth(main, mtp, with_mtp)`` the depth an import of the HF
    directories main and mtp (HFDir, or None) has, ``drafter_params(cfg, vocab)`` a separate drafter's table rows
    (convert/drafter_dir.py: a ``Copy`` row is a target tensor its directory holds again, written by ``to-hf`` and
    passed over by ``from-hf``; a row's transform may keep the first rows of its tensor, ``part_rows``),
    ``drafter_shapes(cfg, vocab)`` their global shapes by key, ``import_shape(mtp config, directory, model config,
    vocab)``, ``mtp_config(cfg, vocab, full config.json, depth, dtype, mtp_layout, family, target, speculative)``
    mtp/'s config.json (``target``: the directory the target's export is written to, None with ``--mtp only``;
    ``speculative``: ``--speculative`` or None), ``check_export(mtp, mtp_layout, serve_for, has_mtp)`` the --mtp it
    writes (one sentence for a layout it has not), ``serving_flags()`` convert/serving.py Export fields
    (``draft``: how the engines serve it, a DraftServing), ``extra_files(cfg, vocab, speculative)`` mtp/'s other
    JSON files."""
    decoder: Callable[[], Any]
    """() -> its ``decoder`` module (mtp_styles/<name>/decoder.py): ``load_drafter(dirs, drafter_dir, target,
    main_weights, dtype, chain_hidden)`` the inference/draft.py ``Drafter`` of an export whose mtp/ is its format
    (``drafter_dir``: that directory where the style keeps a model of its own there), or None."""
    hf_inline: bool
    """Its Hugging Face tensors are the release's MTP layers (``model.layers.N`` after the decoder's, which
    ``--no-mtp`` recognises); a style with its own format keeps them apart."""
    drafter_words: str
    """How ``plan --speculative`` names what drafts (e.g. "the MTP module")."""
    drafter_flops: Optional[Callable[..., float]] = None
    """(family, cfg, padded vocab) -> forward FLOPs per token of one step of a separate drafter, all its weights and
    its attention included (an MTP-only step's count, models/sizes.py ``mtp_only_flops_per_token``); None: it
    has none."""
    summary: str = ""
    """What it is, in a few words (``train --help-config`` lists it under mtp.style)."""
    any_family: bool = False
    """It reads only what every family's model gives (the target's hidden states, its output layer), so every
    family builds it: the config checks accept it whatever a family's ``MTP_STYLES`` declare (``family_styles``),
    and the family gives it the default ``FamilyParts`` where it gives none (models/megatron_model.py)."""
    family_part: Optional[Callable[[str], Any]] = None
    """package -> what a family gives the style beyond its layer spec, read from the package the family names for
    it (models/family.py ``Family.style_parts``; the assistant's: its DrafterParts); None: the style needs nothing
    more."""
    check: Callable[[Any], None] = _no_checks
    """cfg -> its own checks (beyond the traits'), a UserError for the first failure."""
    options: Optional[Callable[[], type]] = None
    """() -> the dataclass of its own options, the config section ``mtp.<name>`` (config/model.py
    ``mtp_config_class``: a YAML mapping or ``mtp.<name>.<field>=`` overrides, unknown keys refused, each field's
    docstring in ``train --help-config``); defined in a torch-free module of its folder (``options.py``) and named
    lazily (config/lazy.py ``lazy_object``), so registering the style imports it only when a config is read. None:
    it has no options of its own."""
    observes_predictions: bool = False
    """Its model hands each draft step's predictions, as the target's token ids, and then the main model's to the MTP
    metrics itself (the metrics become its ``prediction_observer``, training/metric_hooks.py), where a forward hook
    on an output layer would see the wrong calls or ids (e.g. a drafter's head over a draft vocabulary of its own)."""

    def title(self) -> str:
        """How messages name the style: ``mtp.style=<name>``."""
        return f"mtp.style={self.name}"


_REGISTRY: dict[str, MTPStyle] = {}


def register_style(style: MTPStyle) -> MTPStyle:
    """Add ``style`` (once per name)."""
    known = _REGISTRY.get(style.name)
    if known is not None and known is not style:
        raise RuntimeError(f"MTP style {style.name} is registered twice")
    _REGISTRY[style.name] = style
    return style


def _load() -> dict[str, MTPStyle]:
    """Every style, the built-in ones first in ``BUILT_IN`` order, whichever was imported first (a module of one
    style's folder imported directly registers it before the others), then the others as they were registered."""
    for name in BUILT_IN:
        if name not in _REGISTRY:
            importlib.import_module(f"{STYLES_PACKAGE}.{name}")  # its __init__ registers it
    rank = {name: i for i, name in enumerate(BUILT_IN)}
    return dict(sorted(_REGISTRY.items(), key=lambda item: rank.get(item[0], len(rank))))


def styles() -> tuple[MTPStyle, ...]:
    """Every registered style, the built-in ones first."""
    return tuple(_load().values())


def find_style(name: str) -> Optional[MTPStyle]:
    """The style ``mtp.style=name`` picks, or None."""
    return _load().get(name)


def get_style(name: str, where: str = "mtp.style") -> MTPStyle:
    """The style ``mtp.style=name`` picks; one sentence naming the styles otherwise."""
    style = find_style(name)
    if style is None:
        raise UserError(f"{where} is {name!r}; it must be one of {', '.join(repr(n) for n in _load())}")
    return style


def style_of_mtp_dir(config: Optional[dict]) -> MTPStyle:
    """The style whose Hugging Face format an MTP directory's config.json is (its ``convert``'s ``claims``): the
    first style when none claims it (the release's own MTP layers), or with no directory."""
    every = styles()
    if config is not None:
        for style in every:
            if style.convert().claims(config):
                return style
    return every[0]


def family_styles(declared: tuple[str, ...]) -> tuple[str, ...]:
    """The styles a family builds: those its model config declares (``MTP_STYLES``), then every style that works for
    any family (``any_family``)."""
    return tuple(dict.fromkeys([*declared, *(s.name for s in styles() if s.any_family)]))


def style_names(trait: str) -> str:
    """"a or b": the styles with ``trait`` true (how a message names the styles an option needs)."""
    return " or ".join(s.name for s in styles() if getattr(s, trait))
