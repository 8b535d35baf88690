"""Typed view of a Hugging Face GLM-5 ``config.json`` (``glm_moe_dsa``): the DSA families' view
(models/dsa/hf_view.py) with GLM-5's defaults and IndexShare.

A field the file leaves out reads as transformers' GlmMoeDsaConfig reads it (``TRANSFORMERS_DEFAULTS``: GLM-5's
shape, its routing with n_group 1, rms_norm_eps 1e-5). IndexShare as transformers derives it: ``indexer_types``
("full" runs the layer's indexer, "shared" reuses the previous full layer's top-k), else the letters of
``index_topk_pattern`` ("F"/"S"), else ``index_topk_freq``/``index_skip_topk_offset`` (defaults 1 and 2). The
view keeps the list and the frequency and offset that give it (``index_share_of``), which megatron-core builds;
a list no frequency and offset give is refused in one sentence."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from megatron_mtp.errors import UserError
from megatron_mtp.models.dsa.hf_view import INDEX_KEYS, DSAHFConfig, parse_dsa_config  # noqa: F401
from megatron_mtp.models.dsa.hf_view import READ_KEYS as DSA_READ_KEYS
from megatron_mtp.models.hf_common import read_value

SHARE_KEYS = ("indexer_types", "index_topk_pattern", "index_topk_freq", "index_skip_topk_offset",
              "indexer_rope_interleave")
"""GLM-5's own keys (the last: what some engines read, always true for GLM-5)."""
READ_KEYS = DSA_READ_KEYS | set(SHARE_KEYS)
"""Every config.json key the view reads."""

TRANSFORMERS_DEFAULTS = {
    "vocab_size": 154880, "hidden_size": 6144, "intermediate_size": 12288, "moe_intermediate_size": 2048,
    "num_hidden_layers": 78, "num_attention_heads": 64, "num_key_value_heads": 64, "n_shared_experts": 1,
    "n_routed_experts": 256, "routed_scaling_factor": 2.5, "kv_lora_rank": 512, "q_lora_rank": 2048,
    "qk_rope_head_dim": 64, "v_head_dim": 256, "qk_nope_head_dim": 192, "n_group": 1, "topk_group": 1,
    "num_experts_per_tok": 8, "max_position_embeddings": 202752, "rms_norm_eps": 1e-5, "first_k_dense_replace": 3,
    "index_n_heads": 32,
}
"""transformers 5.25's GlmMoeDsaConfig defaults of the fields the view reads (tests compare them)."""


@dataclass(frozen=True, kw_only=True)
class GlmMoeDsaHFConfig(DSAHFConfig):
    """The DSA fields with GLM-5's indexer and IndexShare (transformers' defaults)."""

    model_type: str = "glm_moe_dsa"
    index_n_heads: int = 32
    indexer_types: tuple[str, ...] = ()
    """One per decoder layer: "full" or "shared"."""
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 2


def with_defaults(raw: Mapping[str, Any]) -> dict[str, Any]:
    """``raw`` with transformers' GLM-5 defaults where it gives no value."""
    return {**TRANSFORMERS_DEFAULTS, **{k: v for k, v in raw.items() if v is not None or k not in
                                        TRANSFORMERS_DEFAULTS}}


def share_types(freq: int, offset: int, layers: int) -> list[str]:
    """transformers' indexer_types of a frequency and offset."""
    freq = max(freq, 1)
    return ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(layers)]


def index_share_of(types: list[str], where: str) -> tuple[int, int]:
    """(index_topk_freq, index_skip_topk_offset) whose pattern is ``types``; one sentence where none is."""
    if types[:1] != ["full"]:
        raise UserError(f"{where}: indexer_types {types} does not start with 'full'; the first layer has no earlier "
                        "top-k to reuse, so it cannot be represented")
    if "shared" not in types:
        return 1, 2
    offset = types.index("shared")
    later = [i for i in range(offset + 1, len(types)) if types[i] == "full"]
    freq = later[0] - offset + 1 if later else len(types) - offset + 1
    if share_types(freq, offset, len(types)) != types:
        raise UserError(f"{where}: indexer_types {types} is not one layer in index_topk_freq running its indexer "
                        "after the first index_skip_topk_offset layers, the only pattern megatron-core's IndexShare "
                        "builds; it cannot be represented")
    return freq, offset


def _types(raw: Mapping[str, Any], layers: int, where: str) -> list[str]:
    """The per-layer indexer kinds as transformers derives them (module note)."""
    given = raw.get("indexer_types")
    if given is None and raw.get("index_topk_pattern") is not None:
        pattern = raw["index_topk_pattern"]
        letters = {"F": "full", "S": "shared"}
        if isinstance(pattern, str) and set(pattern) <= set(letters):
            given = [letters[c] for c in pattern]
        elif isinstance(pattern, str):
            raise UserError(f"{where}: index_topk_pattern {pattern!r} holds letters other than F and S; correct it "
                            "in that file.")
        else:
            given = pattern
    if given is None:
        freq = read_value(raw, "index_topk_freq", int, 1, where)
        offset = read_value(raw, "index_skip_topk_offset", int, 2, where)
        given = share_types(freq, offset, layers)
    if not isinstance(given, (list, tuple)) or any(t not in ("full", "shared") for t in given):
        raise UserError(f"{where}: indexer_types {given!r} must be a list of 'full' and 'shared'; correct it in that "
                        "file.")
    if len(given) != layers:
        raise UserError(f"{where}: indexer_types has {len(given)} entries for {layers} layers (num_hidden_layers); "
                        "correct it in that file.")
    return list(given)


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> GlmMoeDsaHFConfig:
    """The view of a GLM-5 config.json dict; a malformed or contradicting field is a UserError."""
    full = with_defaults(raw)
    if full.get("indexer_rope_interleave") is False:
        raise UserError(f"{where}: indexer_rope_interleave is false; GLM-5's indexer rotates interleaved pairs, so "
                        "it cannot be represented")
    layers = read_value(full, "num_hidden_layers", int, 78, where)
    types = _types(full, layers, where)
    freq, offset = index_share_of(types, where)
    return parse_dsa_config(full, where, GlmMoeDsaHFConfig, indexer_types=tuple(types), index_topk_freq=freq,
                            index_skip_topk_offset=offset)

