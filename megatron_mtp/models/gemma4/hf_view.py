"""Typed view of a Hugging Face Gemma 4 text ``config.json`` (``gemma4_text``, ``Gemma4ForCausalLM``), or of
the text part of a multimodal one (``gemma4``, ``Gemma4ForConditionalGeneration``: its ``text_config``).

``parse_hf_config`` reads it the way transformers 5.25's ``Gemma4TextConfig`` does: ``layer_types``
defaults to every sixth layer full (and the last); the full-attention layers take ``global_head_dim``
(default 512) and, with ``attention_k_eq_v``, ``num_global_key_value_heads`` (a saved file may instead
hold ``per_layer_config``, which transformers writes); ``rope_parameters`` per layer type, default
sliding 1e4 and full "proportional" 1e6 over 25%. Per-layer embeddings (``hidden_size_per_layer_input``
> 0, the E2B/E4B models), key/value sharing inside the model (``num_kv_shared_layers``), the double-wide
MLP and bidirectional attention are refused by the importer (hf_config.py), which names them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.config.moe_layers import MoeLayers
from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import EosIds, eos_ids, mtp_depth, read_view_fields
from megatron_mtp.models.hf_common import read_value as _value

SLIDING, FULL = "sliding_attention", "full_attention"
DEFAULT_ROPE = {SLIDING: {"rope_type": "default", "rope_theta": 10000.0},
                FULL: {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1000000.0}}


def embedding_multiplier(hidden_size: int) -> float:
    """Gemma's embedding multiplier, sqrt(hidden), as transformers computes it (``hidden ** 0.5``): the decoder's
    view, the trained model and the assistant read this one number."""
    return float(hidden_size) ** 0.5


@dataclass(frozen=True, kw_only=True)
class Gemma4HFConfig:
    """The architecture fields of a Gemma 4 text config.json, as HF names them (without a default: required)."""

    model_type: str = "gemma4_text"
    architectures: tuple[str, ...] = ()
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int = 4
    head_dim: int = 256
    global_head_dim: int = 512
    num_global_key_value_heads: Optional[int] = None
    hidden_activation: str = "gelu_pytorch_tanh"
    max_position_embeddings: int = 131072
    initializer_range: float = 0.02
    rms_norm_eps: float = 1e-6
    tie_word_embeddings: bool = True
    attention_bias: bool = False
    attention_dropout: float = 0.0
    sliding_window: int = 512
    final_logit_softcapping: Optional[float] = None
    hidden_size_per_layer_input: int = 256
    attention_k_eq_v: bool = False
    num_kv_shared_layers: int = 0
    enable_moe_block: bool = False
    use_double_wide_mlp: bool = False
    num_experts: Optional[int] = None
    top_k_experts: Optional[int] = None
    moe_intermediate_size: Optional[int] = None
    use_bidirectional_attention: Optional[str] = None
    layer_types: tuple[str, ...] = ()
    rope_theta: float = 10000.0
    """The sliding layers' RoPE base (rope_parameters.sliding_attention)."""
    global_rope_theta: float = 1000000.0
    global_partial_rotary_factor: float = 0.25
    num_nextn_predict_layers: int = 0
    bos_token_id: Optional[int] = None
    eos_token_id: EosIds = None
    pad_token_id: Optional[int] = None
    torch_dtype: Optional[str] = None
    quantization_config: Optional[dict] = None
    multimodal: bool = False
    """Read from a Gemma4ForConditionalGeneration config.json (its text_config)."""

    # -- the names every family's view shares (models/hf_common.HFView)
    @property
    def n_routed_experts(self) -> int:
        return (self.num_experts or 0) if self.enable_moe_block else 0

    @property
    def num_experts_per_tok(self) -> int:
        return self.top_k_experts or 1

    n_shared_experts = 0
    n_group = 1
    topk_group = 1
    norm_topk_prob = True
    routed_scaling_factor = 1.0
    scoring_func = "softmax"

    @property
    def embedding_multiplier(self) -> float:
        """The embedding is scaled by sqrt(hidden) (``embedding_multiplier``)."""
        return embedding_multiplier(self.hidden_size)

    @property
    def global_kv_heads(self) -> int:
        """Key/value heads of the full-attention layers."""
        if self.attention_k_eq_v and self.num_global_key_value_heads is not None:
            return self.num_global_key_value_heads
        return self.num_key_value_heads

    @property
    def moe_layers(self) -> MoeLayers:
        return MoeLayers(self.num_hidden_layers, self.n_routed_experts, 0)

    def is_moe_layer(self, layer_index: int) -> bool:
        return bool(self.n_routed_experts)

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        eos = self.eos_token_id
        return () if eos is None else (eos,) if isinstance(eos, int) else tuple(eos)


READ_KEYS = frozenset({"rope_parameters", "per_layer_config", "dtype", "num_mtp_layers", "layer_types",
                       "vocab_size_per_layer_input"})
"""config.json keys the view reads besides its scalar fields."""


def text_config(raw: Mapping[str, Any], where: str) -> tuple[Mapping[str, Any], bool]:
    """(the text model's config dict, whether it came from a multimodal file)."""
    if isinstance(raw, Mapping) and raw.get("model_type") == "gemma4":
        inner = raw.get("text_config")
        if not isinstance(inner, Mapping):
            raise UserError(f"{where}: a Gemma 4 multimodal config.json needs a text_config object; correct it in "
                            "that file.")
        return inner, True
    return raw, False


def default_layer_types(layers: int) -> tuple[str, ...]:
    kinds = [FULL if (i + 1) % 6 == 0 else SLIDING for i in range(layers)]
    if kinds:
        kinds[-1] = FULL
    return tuple(kinds)


def _global_overrides(raw: Mapping[str, Any], where: str, kinds: tuple[str, ...]) -> dict[str, Any]:
    """global_head_dim / num_global_key_value_heads, from those keys or from a saved per_layer_config."""
    out: dict[str, Any] = {}
    per_layer = raw.get("per_layer_config")
    if isinstance(per_layer, Mapping) and FULL in kinds:  # what transformers saved: a layer not in it (or a field
        # not in its entry) takes the model's own head_dim / num_key_value_heads, as transformers builds it
        full = [per_layer.get(str(i), per_layer.get(i)) for i, k in enumerate(kinds) if k == FULL]
        entry = next((f for f in full if isinstance(f, Mapping)), {})
        out["global_head_dim"] = _value(entry, "head_dim", int, None, where) or raw.get("head_dim")
        out["num_global_key_value_heads"] = (_value(entry, "num_key_value_heads", int, None, where)
                                             or raw.get("num_key_value_heads"))
    for key in ("global_head_dim", "num_global_key_value_heads"):
        if raw.get(key) is not None:
            out[key] = _value(raw, key, int, None, where)
    return {k: v for k, v in out.items() if v is not None}


def _rope(raw: Mapping[str, Any], where: str) -> dict[str, float]:
    params = raw.get("rope_parameters") or DEFAULT_ROPE
    if not isinstance(params, Mapping):
        raise UserError(f"{where}: rope_parameters must be an object with sliding_attention and full_attention.")
    sliding, full = params.get(SLIDING) or DEFAULT_ROPE[SLIDING], params.get(FULL) or DEFAULT_ROPE[FULL]
    if sliding.get("rope_type", "default") != "default" or full.get("rope_type", "default") not in (
            "default", "proportional") or full.get("factor", 1.0) != 1.0:
        raise UserError(f"{where}: rope_parameters {dict(params)} is not Gemma 4's (default RoPE on the sliding "
                        "layers, proportional RoPE without a factor on the full ones); it cannot be represented.")
    share = 1.0 if full.get("rope_type", "default") == "default" else full.get("partial_rotary_factor", 1.0)
    return {"rope_theta": float(sliding.get("rope_theta", 10000.0)),
            "global_rope_theta": float(full.get("rope_theta", 10000.0)),
            "global_partial_rotary_factor": float(share)}


def parse_hf_config(raw: Mapping[str, Any], where: str = "config.json") -> Gemma4HFConfig:
    """The view of a config.json dict; a missing required field or a malformed one is a UserError."""
    text, multimodal = text_config(raw, where)
    values = read_view_fields(text, Gemma4HFConfig, where, "Gemma 4")
    kinds = text.get("layer_types")
    if kinds is None:
        kinds = default_layer_types(values["num_hidden_layers"])
    if not isinstance(kinds, (list, tuple)) or any(k not in (SLIDING, FULL) for k in kinds):
        raise UserError(f"{where}: layer_types must list {SLIDING} or {FULL} per layer; correct it in that file.")
    kinds = tuple(kinds)
    if kinds and kinds[-1] != FULL:  # transformers forces it, with a warning
        kinds = kinds[:-1] + (FULL,)
    values.update(_global_overrides(text, where, kinds), **_rope(text, where))
    values.update(
        model_type=str(text.get("model_type", "gemma4_text")),
        architectures=tuple(str(a) for a in raw.get("architectures") or ()),
        layer_types=kinds,
        num_nextn_predict_layers=mtp_depth(text, where),
        eos_token_id=_value(text, "eos_token_id", eos_ids, None, where),
        torch_dtype=values["torch_dtype"] or _value(text, "dtype", str, None, where),
        multimodal=multimodal,
    )
    if values["num_attention_heads"] % values["num_key_value_heads"]:
        raise UserError(f"{where}: num_attention_heads ({values['num_attention_heads']}) must be a multiple of "
                        f"num_key_value_heads ({values['num_key_value_heads']}).")
    return Gemma4HFConfig(**values)
