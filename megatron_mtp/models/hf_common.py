"""What the families' Hugging Face configs share: the routing-group check, the special token ids, and
what an export carries back of the config.json a checkpoint was imported from."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Protocol, Union, runtime_checkable

from megatron_mtp.config.model import ModelConfig, MTPConfig
from megatron_mtp.errors import UserError
from megatron_mtp.models.tensor_table import MoeLayers

TOKEN_ID_KEYS = ("bos_token_id", "eos_token_id", "pad_token_id")
EosIds = Union[int, tuple[int, ...], None]
"""config.json's eos_token_id: one id, several, or none."""
_SCALARS: dict[str, Callable[[Any], Any]] = {"int": int, "float": float, "bool": bool, "str": str, "dict": dict}


def scalar_kind(annotation: str) -> Optional[Callable[[Any], Any]]:
    """The converter of a typed view's field annotation ("int", "Optional[float]"...); None for others."""
    inner = annotation[len("Optional["):-1] if annotation.startswith("Optional[") else annotation
    return _SCALARS.get(inner)


def eos_ids(value: Any) -> EosIds:
    """config.json's eos_token_id as an int or a tuple of ints."""
    return tuple(int(v) for v in value) if isinstance(value, (list, tuple)) else int(value)


def _strict(kind: Callable[[Any], Any], value: Any) -> Any:
    """JSON's own types only: an int field takes an integer (2.0 too, never 2.5, "2" or true), a float
    field a number, a bool field true or false (never the string "false"), a str field a string."""
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ValueError
    if kind in (int, float) and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ValueError
    if kind is int and isinstance(value, float) and not value.is_integer():
        raise ValueError
    if kind is str and not isinstance(value, str):
        raise ValueError
    if kind is dict and not isinstance(value, Mapping):
        raise ValueError
    return kind(value)


_KIND_WORDS = {int: "an integer", float: "a number", bool: "true or false", str: "a string", dict: "an object"}


def read_value(raw: Mapping[str, Any], key: str, kind: Callable[[Any], Any], default: Any, where: str) -> Any:
    """``raw[key]`` as ``kind`` (JSON's own types: ``_strict``), ``default`` when absent or null; a
    malformed value is a UserError naming it."""
    value = raw.get(key)
    if value is None:
        return default
    try:
        return _strict(kind, value) if kind in _KIND_WORDS else kind(value)
    except (TypeError, ValueError):
        wanted = f"; it must be {_KIND_WORDS[kind]}" if kind in _KIND_WORDS else ""
        raise UserError(f"{where}: field '{key}' has a malformed value {value!r}{wanted}; correct it in that "
                        "file.") from None


def read_view_fields(raw: Mapping[str, Any], view: type, where: str, model_name: str) -> dict[str, Any]:
    """The scalar fields of a typed config.json view (a dataclass: fields without a default are
    required), read from ``raw`` with their defaults; a file that is not an object, lacks a required
    field or holds a malformed value is a UserError."""
    if not isinstance(raw, Mapping):
        raise UserError(f"{where} must hold a JSON object.")
    fields = dataclasses.fields(view)
    for f in fields:
        if f.default is dataclasses.MISSING and raw.get(f.name) is None:
            raise UserError(f"{where} has no '{f.name}'; it is required for a {model_name} model.")
    values = {}
    for f in fields:
        kind = scalar_kind(f.type)
        if kind is not None:
            default = None if f.default is dataclasses.MISSING else f.default
            values[f.name] = read_value(raw, f.name, kind, default, where)
            if f.default is dataclasses.MISSING and kind is int and values[f.name] < 1:  # the sizes
                raise UserError(f"{where}: field '{f.name}' is {values[f.name]}; it must be a positive integer; "
                                "correct it in that file.")
    return values


def missing_or_value(raw: Mapping[str, Any], key: str, value: Any) -> str:
    """How an error names a field's value: ``(8)``, or ``(not in the file; transformers' default 8)``."""
    return f"({value})" if raw.get(key) is not None else f"(not in the file; transformers' default {value})"


_NOTED: set[str] = set()


def note_once(text: str) -> None:
    """A note on stderr, once per process (a config.json is read by several steps of one command)."""
    import sys

    if text not in _NOTED:
        _NOTED.add(text)
        print(f"note: {text}", file=sys.stderr, flush=True)


def mtp_depth(raw: Mapping[str, Any], where: str = "config.json") -> int:
    """MTP depth an HF config declares: ``num_nextn_predict_layers`` (or ``num_mtp_layers``), else 0."""
    spelling = "num_nextn_predict_layers" if "num_nextn_predict_layers" in raw else "num_mtp_layers"
    return read_value(raw, spelling, int, 0, where)


def check_mtp_export(model: ModelConfig, mtp: MTPConfig, depth: int, format_name: str) -> None:
    """What every family's HF format needs of the MTP layers an export writes: no more than the config
    has (their kind follows the engines' rule already: config/moe_layers.py)."""
    if depth > mtp.modules:
        raise UserError(f"asked for {depth} MTP layers but the config has {mtp.modules} MTP module(s)")
    check_group_routing(model, "model config")


NOT_CARRIED_ANY_FAMILY = {
    "quantization_config": "the weights are dequantized on import",
    "transformers_version": "it records who wrote the source file",
    "_name_or_path": "it records where the source was loaded from",
    "name_or_path": "it records where the source was loaded from",
    "torch_dtype": "the export's --dtype decides",
    "dtype": "the export's --dtype decides (written as torch_dtype)",
    "num_mtp_layers": "transformers' spelling of num_nextn_predict_layers",
    "num_nextn_predict_layers": "the export layout decides",
}
"""Fields of an imported config.json that no family's export writes back, and why (a family adds its own)."""
IGNORED_ANY_FAMILY = frozenset({
    "transformers_version", "use_cache", "pad_token_id", "_name_or_path", "name_or_path", "output_router_logits",
    "router_aux_loss_coef", "return_dict", "output_hidden_states", "output_attentions", "torchscript", "id2label",
    "label2id", "problem_type", "tokenizer_class", "chunk_size_feed_forward", "is_encoder_decoder",
    "tf_legacy_loss", "use_bfloat16", "torch_dtype", "dtype", "bos_token_id", "eos_token_id", "architectures",
    "model_type", "quantization_config",
})
"""config.json keys that say nothing about the architecture, in any family's file."""


@dataclasses.dataclass(frozen=True)
class HFConfigFile:
    """A config.json as an export writes it (``values``, in the release's key order); the family's typed
    view (hf_view.py) is what every reader uses."""

    values: dict

    def to_dict(self) -> dict[str, Any]:
        return dict(self.values)


def check_keys(raw: Any, where: str, architecture: str, known: frozenset) -> None:
    """What a converter refuses before reading a family's config.json: not an object, other
    ``architectures``, a key outside ``known``; one sentence each."""
    if not isinstance(raw, Mapping):
        raise UserError(f"{where} must hold a JSON object")
    archs = list(raw.get("architectures") or ())
    if archs and architecture not in archs:
        raise UserError(f"{where}: architectures {archs} is not {architecture}")
    for key in raw:
        if key not in known:
            raise UserError(f"{where}: field '{key}' is not understood by the converter; it cannot be represented")


Reader = Callable[[Mapping[str, Any]], tuple[ModelConfig, MTPConfig, int]]
"""A family's from_hf_config."""


def check_group_routing(cfg: ModelConfig, where: str) -> None:
    groups = cfg.router_num_groups or 1
    if groups <= 1 or cfg.num_experts == 0:
        return
    group_topk = cfg.router_group_topk or 1
    per_group = cfg.router_topk // group_topk
    wanted = 2 if cfg.router_score_function == "sigmoid" else 1
    if per_group != wanted:
        raise UserError(
            f"{where}: router_topk/router_group_topk = {cfg.router_topk}/{group_topk} makes megatron-core "
            f"score each expert group by its top-{per_group} experts while the Hugging Face "
            f"format scores it by its top-{wanted}; choose router_topk = {wanted} x router_group_topk "
            "or disable groups (router_num_groups: null)"
        )


def _architecture(raw: Mapping[str, Any], read: Reader) -> Optional[tuple[ModelConfig, int]]:
    """The model a config.json describes (fields that only training reads zeroed); None if unreadable."""
    try:
        model, _, vocab = read(raw)
    except UserError:
        return None
    return dataclasses.replace(model, make_vocab_size_divisible_by=1, aux_loss_coeff=0.0,
                               aux_loss_type=ModelConfig.aux_loss_type), vocab


def carry_source_fields(
    written: Mapping[str, Any], source: Optional[Mapping[str, Any]], tokenizer_ids: Mapping[str, Optional[int]],
    read: Reader, not_carried: Mapping[str, str],
) -> dict[str, Any]:
    """``written`` (the config.json of an export) with what still holds of ``source``, the config.json
    the checkpoint was imported from, both read by the family's ``read`` (its from_hf_config).

    When both describe the same model, every source value is kept whose substitution still reads as
    that model (``head_dim``, ``pad_token_id``, ``n_group`` of a greedy router, a release spelling of
    ``rope_scaling``, ...), except the family's ``not_carried`` fields and a null in place of a value we write
    (transformers' strict config class refuses nulls for its integer fields). Special token ids: the
    tokenizer's id wins over a different stored one; a stored EOS list holding it stays a list.
    """
    out = dict(written)
    ours = _architecture(written, read)
    if source is not None and ours is not None and _architecture(source, read) == ours:
        for key, value in source.items():
            if key in not_carried or key in TOKEN_ID_KEYS or out.get(key, _MISSING) == value:
                continue
            if value is None and out.get(key) is not None:
                continue
            if _architecture({**out, key: value}, read) == ours:
                out[key] = value
    else:
        source = None
    ids = {key: merge_token_id(tokenizer_ids.get(key), source.get(key) if source else None) for key in TOKEN_ID_KEYS}
    ordered: dict[str, Any] = {}
    for key, value in out.items():
        if key == "bos_token_id":  # the three ids together, where the release has bos/eos
            ordered.update((k, v) for k, v in ids.items() if v is not None or k in written or k in (source or {}))
        elif key not in TOKEN_ID_KEYS:
            ordered[key] = value
    return ordered


def merge_token_id(tokenizer_id: Optional[int], stored: Any) -> Any:
    """The special token id to write: the tokenizer's, unless it names none or a stored list holds it."""
    if tokenizer_id is None:
        return stored
    if isinstance(stored, list) and tokenizer_id in stored:
        return stored
    return tokenizer_id


_MISSING = object()


@dataclasses.dataclass(frozen=True)
class YarnScaling:
    """``rope_scaling`` of type yarn (DeepSeek-V3's view; the decoder's RoPE reads it, models/decoding/layers.py)."""

    factor: float
    original_max_position_embeddings: int
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    attention_factor: Optional[float] = None
    """transformers only: overrides the attention factor derived from mscale/mscale_all_dim."""
    truncate: bool = True
    """transformers only: round the YaRN correction range to whole dimensions."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "type": "yarn", "rope_type": "yarn", "factor": self.factor,
            "original_max_position_embeddings": self.original_max_position_embeddings,
            "beta_fast": self.beta_fast, "beta_slow": self.beta_slow,
            "mscale": self.mscale, "mscale_all_dim": self.mscale_all_dim,
        }
        if self.attention_factor is not None:
            out["attention_factor"] = self.attention_factor
        if not self.truncate:
            out["truncate"] = False
        return out


@runtime_checkable
class HFView(Protocol):
    """What every family's typed config.json view holds under the same names (models/<family>/
    hf_view.py): the decoder's shared layers (norms, dense MLP, MoE, MTP module) read these and
    nothing else; the attention class reads the family's own fields."""

    model_type: str
    hidden_size: int
    num_hidden_layers: int
    vocab_size: int
    intermediate_size: int
    moe_intermediate_size: int
    n_routed_experts: int
    n_shared_experts: int
    num_experts_per_tok: int
    n_group: int
    topk_group: int
    norm_topk_prob: bool
    routed_scaling_factor: float
    scoring_func: str
    """"sigmoid" (DeepSeek-V3's noaux_tc, with e_score_correction_bias and expert groups) or "softmax"
    (top k of a softmax over every expert)."""
    rms_norm_eps: float
    tie_word_embeddings: bool
    num_nextn_predict_layers: int
    quantization_config: Optional[dict]

    @property
    def moe_layers(self) -> MoeLayers: ...

    def is_moe_layer(self, layer_index: int) -> bool: ...

    @property
    def eos_token_ids(self) -> tuple[int, ...]: ...
