"""Gemma 4's own model fields (``model.family=gemma4`` builds this class) and their checks.

A Gemma 4 text model interleaves two kinds of layers (``layer_kinds``): sliding-window attention with
``head_dim``-wide heads and ``num_query_groups`` key/value heads under RoPE base ``rope_theta``, and full
attention with ``global_head_dim``-wide heads and ``global_query_groups`` key/value heads, whose keys are
also its values (``attention_k_eq_v``), under "proportional" RoPE (``global_partial_rotary_factor`` of the
frequencies, base ``global_rope_theta``). Every layer runs a dense GELU-tanh MLP and, with
``num_experts`` > 0, an MoE block beside it (softmax top-k renormalised, a learned per-expert scale, a
router that reads the un-normalised residual); their sum is what the layer adds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from megatron_mtp.config import pipeline_layout
from megatron_mtp.config.moe_layers import MoeLayers
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.errors import UserError
from megatron_mtp.models.softmax_routing import SoftmaxRouting

SLIDING, FULL = "sliding_attention", "full_attention"
FULL_EVERY = 6
"""Without ``layer_types``, every sixth layer is full attention (5 sliding : 1 full), and the last one."""


@dataclass
class Gemma4ModelConfig(SoftmaxRouting):
    tie_embeddings: bool = True
    """Share the input embedding with the output head (Gemma 4: true)."""
    # the routing: the softmax-routed families' defaults (models/softmax_routing.py); no shared experts, its
    # dense MLP runs beside the experts instead, and its learned per-expert scale replaces a scaling factor

    head_dim: int = 256
    """Head width of the sliding-window layers (HF head_dim)."""
    num_query_groups: int = 8
    """Key/value heads of the sliding-window layers (HF num_key_value_heads)."""
    global_head_dim: int = 512
    """Head width of the full-attention layers (HF global_head_dim)."""
    global_query_groups: Optional[int] = 2
    """Key/value heads of the full-attention layers (HF num_global_key_value_heads); null: num_query_groups."""
    attention_k_eq_v: bool = True
    """The full-attention layers have no value projection: the key projection's output is also the value
    (before the key norm and RoPE; HF attention_k_eq_v)."""
    sliding_window: int = 1024
    """Tokens a sliding-window layer attends to, itself included (HF sliding_window)."""
    layer_types: Optional[list[str]] = None
    """Each decoder layer's attention, sliding_attention or full_attention (HF layer_types); the last layer
    must be full. null: every sixth layer and the last are full, the others sliding (Gemma 4's 5:1)."""
    global_rope_theta: float = 1.0e6
    """RoPE base of the full-attention layers (model.rope_theta is the sliding layers')."""
    global_partial_rotary_factor: float = 0.25
    """Share of the full-attention heads' frequencies that rotate ("proportional" RoPE: the frequencies
    keep the whole head's spacing, the rest are zero)."""
    final_logit_softcapping: Optional[float] = 30.0
    """Logits become c·tanh(z / c) (HF final_logit_softcapping); null: none."""

    def layer_kinds(self) -> list[str]:
        """The attention of each decoder layer (``layer_types``, or the 5:1 default)."""
        if self.layer_types is not None:
            return list(self.layer_types)
        kinds = [FULL if (i + 1) % FULL_EVERY == 0 else SLIDING for i in range(self.num_layers)]
        if kinds:
            kinds[-1] = FULL
        return kinds

    DENSE_MLP_BESIDE_MOE: ClassVar[bool] = True
    MTP_STYLES: ClassVar[tuple[str, ...]] = ("sequential", "parallel", "assistant")
    NO_A2A_OVERLAP: ClassVar[Optional[str]] = (
        "megatron-core's overlapped schedule runs a layer through its own attention and MoE callables, which take "
        "Gemma 4's feed-forward block (a dense MLP beside the experts) for a dense layer and skip its layer_scalar")

    def attention_input_gathers(self, layer: Optional[int]) -> int:
        """q, k and v are separate projections; a layer whose keys are its values has no v."""
        kind = MTP_KIND if layer is None else self.layer_kinds()[layer]
        return 2 if kind_shares_kv(self, kind) else 3

    def moe_layer_rule(self) -> MoeLayers:
        """Every layer (and the MTP layer) carries the MoE block when num_experts > 0."""
        return MoeLayers(self.num_layers, self.num_experts, 0)

    def check(self, cfg: Any) -> None:
        check(cfg)


def kind_head_dim(m: Gemma4ModelConfig, kind: str) -> int:
    return m.global_head_dim if kind == FULL else m.head_dim


def kind_groups(m: Gemma4ModelConfig, kind: str) -> int:
    if kind == FULL and m.global_query_groups is not None:
        return m.global_query_groups
    return m.num_query_groups


def kind_shares_kv(m: Gemma4ModelConfig, kind: str) -> bool:
    """The layer's keys are its values (no value projection)."""
    return kind == FULL and m.attention_k_eq_v


def kind_rope(m: Gemma4ModelConfig, kind: str) -> tuple[float, float]:
    """(base, share of the frequencies that rotate) of the layer kind's RoPE."""
    return (m.global_rope_theta, m.global_partial_rotary_factor) if kind == FULL else (m.rope_theta, 1.0)


MTP_KIND = FULL
"""An MTP layer on a Gemma 4 trunk is built as the model's last layer is: full attention."""


def check(cfg) -> None:
    """One sentence for the first Gemma 4 field the model or the layout cannot take."""
    m, tp = cfg.model, cfg.parallel.tensor
    kinds = m.layer_kinds()
    if m.layer_types is not None:
        wrong = [k for k in kinds if k not in (SLIDING, FULL)]
        if wrong:
            raise UserError(f"model.layer_types holds {wrong[0]!r}; each entry must be {SLIDING} or {FULL}")
        if len(kinds) != m.num_layers:
            raise UserError(f"model.layer_types lists {len(kinds)} layers but model.num_layers is {m.num_layers}; "
                            "give one entry per decoder layer")
        if kinds and kinds[-1] != FULL:
            raise UserError(f"model.layer_types ends with {kinds[-1]}; Gemma 4's last layer is {FULL}, set it so")
    for name in ("head_dim", "global_head_dim", "num_query_groups", "sliding_window"):
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} is {getattr(m, name)}; set a positive number")
    for kind in sorted(set(kinds) | {FULL}):
        groups, field = kind_groups(m, kind), ("global_query_groups" if kind == FULL and m.global_query_groups
                                                is not None else "num_query_groups")
        if groups < 1 or m.num_attention_heads % groups:
            raise UserError(f"model.{field}={groups} must be positive and divide "
                            f"model.num_attention_heads={m.num_attention_heads}")
        if groups % tp:
            raise UserError(f"model.{field}={groups} is not divisible by parallel.tensor={tp}; every "
                            "tensor-parallel rank must hold whole key/value heads")
        if kind_head_dim(m, kind) % 2:
            raise UserError(f"the {kind} layers' head width {kind_head_dim(m, kind)} is odd; RoPE needs an even one")
    if not 0.0 < m.global_partial_rotary_factor <= 1.0:
        raise UserError(f"model.global_partial_rotary_factor is {m.global_partial_rotary_factor}; it must be in (0, 1]")
    if m.final_logit_softcapping is not None and m.final_logit_softcapping <= 0:
        raise UserError(f"model.final_logit_softcapping is {m.final_logit_softcapping}; give a positive cap or null")
    if m.num_experts:
        fixed = (("first_k_dense", 0, "its MoE block runs in every layer"),
                 ("num_shared_experts", 0, "its dense MLP runs beside the experts instead"),
                 ("router_score_function", "softmax", "its router is a softmax over every expert"),
                 ("router_norm_topk_prob", True, "it renormalises the chosen experts' weights"),
                 ("router_num_groups", None, "it has no expert groups"),
                 ("router_topk_scaling_factor", 1.0, "its learned per-expert scale does that"),
                 ("router_enable_expert_bias", False, "its router has no expert bias"))
        for name, value, why in fixed:
            if getattr(m, name) != value:
                raise UserError(f"model.{name} is {getattr(m, name)!r}, but a Gemma 4 model needs {value!r} "
                                f"({why}); remove it from the config")
    if cfg.parallel.context > 1:
        check_context_parallel(cfg)
    if cfg.data.reset_position_ids:
        raise UserError("data.reset_position_ids is not built for model.family=gemma4 (its attention numbers "
                        "positions from the start of each sequence); set it to false")
    if cfg.mtp.num_layers and get_style(cfg.mtp.style).separate_drafter:
        check_assistant(cfg)


SLIDING_CP_COMM = "a2a"
"""How Transformer Engine's context parallelism runs the sliding-window layers (specs.py): its ring (p2p, the
default) refuses a window, its all-to-all takes one and splits each rank's heads over the context ranks."""


def check_context_parallel(cfg) -> None:
    """The sliding-window layers' all-to-all (SLIDING_CP_COMM) needs whole query and key/value heads per context
    rank."""
    m, p = cfg.model, cfg.parallel
    if SLIDING not in m.layer_kinds():
        return
    heads, groups = m.num_attention_heads // p.tensor, m.num_query_groups // p.tensor
    if heads % p.context or groups % p.context:
        raise UserError(f"parallel.context={p.context} splits the heads of Gemma 4's sliding-window layers over the "
                        f"context-parallel ranks (Transformer Engine's all-to-all, the one that takes a window), but "
                        f"a tensor-parallel rank holds {heads} query and {groups} key/value heads "
                        f"(model.num_attention_heads and model.num_query_groups / parallel.tensor); pick a "
                        "parallel.context that divides both")


def stored_layers(model: Gemma4ModelConfig) -> dict[str, int]:
    """kind -> the target's decoder layer whose keys/values an assistant layer of that kind reads (the last one)."""
    return last_of_each_kind(model.layer_kinds())


def last_of_each_kind(kinds) -> dict[str, int]:
    """kind -> the index of the last layer of that kind in ``kinds`` (a model config's, or a config.json's)."""
    return {kind: max(i for i, k in enumerate(kinds) if k == kind) for kind in (SLIDING, FULL) if kind in kinds}


def check_assistant(cfg) -> None:
    """One sentence for the first thing a Gemma 4 run with an assistant (models/gemma4/assistant/) cannot take:
    each of its layers reads the target's last layer of its kind, which must exist and sit on the pipeline stage
    with the loss, where the assistant runs."""
    a, m, p = cfg.mtp.assistant, cfg.model, cfg.parallel
    kinds, stored = a.kinds(), stored_layers(m)
    for kind in kinds:
        if kind not in (SLIDING, FULL):
            raise UserError(f"mtp.assistant.layer_types holds {kind!r}; each entry must be {SLIDING} or {FULL}")
        if kind not in stored:
            raise UserError(f"the assistant has {kind} layers, which read the target's last {kind} layer, and the "
                            f"target (model.layer_types) has none; use the target's kinds in mtp.assistant.layer_types")
        if a.num_attention_heads % kind_groups(m, kind):
            raise UserError(f"mtp.assistant.num_attention_heads={a.num_attention_heads} must be a multiple of the "
                            f"target's {kind} key/value heads ({kind_groups(m, kind)}), whose keys it reads")
    if kinds and kinds[-1] != FULL:
        raise UserError(f"mtp.assistant.layer_types ends with {kinds[-1]}; an assistant's last layer is {FULL} "
                        "(transformers builds it so, and an export with another would not load), set it so")
    if p.pipeline > 1 and not m.tie_embeddings:
        raise UserError("an assistant with parallel.pipeline > 1 needs model.tie_embeddings=true: it looks its "
                        "steps' token embeddings up on the last stage, which holds the input embedding only as the "
                        "tied output weight; tie the embeddings or set parallel.pipeline=1")
    last = pipeline_layout.stages(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                  p.pipeline_layout)[-1]
    away = sorted(i for kind, i in stored.items() if kind in kinds and i not in last.layers)
    if away:
        raise UserError(f"the assistant reads the keys and values of decoder layer {away[0]}, which the pipeline "
                        f"places away from the last stage (it holds layers {list(last.layers)}); put the target's "
                        "last layer of each kind on the last stage with parallel.pipeline_layout")
