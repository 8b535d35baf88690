"""THE tensor table of the Gemma 4 family: megatron-core keys of the modules in models/gemma4/ <->
transformers' ``Gemma4ForCausalLM`` names, per layer kind.

A Gemma 4 layer's tensors depend on its kind (sliding or full attention: head widths, key/value heads,
and no value projection where keys are values), so the rules of layer i are those of
``model.layer_kinds()[i]`` and an MTP layer's or parallel head's are those of its kind (``MTP_KIND``); ``rule_for_key``
reads the model to tell. The routed experts are one HF tensor per layer with a leading expert axis,
as megatron-core's global checkpoint tensor is (``StackedExperts``): ``experts.gate_up_proj`` [E, 2I, H] (gate
rows, then up rows, as megatron-core's fc1) and ``experts.down_proj`` [E, H, I]. ``layer_scalar`` is a
buffer. MTP modules use the release naming (layer ``num_hidden_layers + d``, DeepSeek-V3's sub-names):
transformers' Gemma 4 has none, and the release ships none.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.models.gemma4.model_config import (
    MTP_KIND,
    SLIDING,
    kind_groups,
    kind_head_dim,
    kind_shares_kv,
)
from megatron_mtp.models.tensor_table import MTP_OWN, Rule, Spec, Table, hidden
from megatron_mtp.models.tensor_transforms import GATED, StackedExperts


def _attention(kind: str) -> tuple[Rule, ...]:
    d = lambda m: kind_head_dim(m, kind)  # noqa: E731
    kv = lambda m: (kind_groups(m, kind) * d(m), m.hidden_size)  # noqa: E731
    rules = [
        Rule("input_layernorm.weight", ("input_layernorm.weight",), hidden, "none", "block_norm"),
        Rule("self_attention.linear_q.weight", ("self_attn.q_proj.weight",),
             lambda m: (m.num_attention_heads * d(m), m.hidden_size)),
        Rule("self_attention.linear_k.weight", ("self_attn.k_proj.weight",), kv),
        Rule("self_attention.linear_v.weight", ("self_attn.v_proj.weight",), kv),
        Rule("self_attention.q_layernorm.weight", ("self_attn.q_norm.weight",), lambda m: (d(m),), "none", "norm"),
        Rule("self_attention.k_layernorm.weight", ("self_attn.k_norm.weight",), lambda m: (d(m),), "none", "norm"),
        Rule("self_attention.linear_proj.weight", ("self_attn.o_proj.weight",),
             lambda m: (m.hidden_size, m.num_attention_heads * d(m))),
        Rule("self_attention.post_layernorm.weight", ("post_attention_layernorm.weight",), hidden, "none", "norm"),
    ]
    return tuple(rules)


ATTENTION = {kind: _attention(kind) for kind in ("sliding_attention", "full_attention")}
LAYER = (Rule("layer_scalar", ("layer_scalar",), lambda m: (1,), "none", "buffer"),)
"""The layer's own output multiplier (no module's: not an attention or MLP tensor)."""
DENSE = (
    Rule("mlp.pre_feedforward_layernorm.weight", ("pre_feedforward_layernorm.weight",), hidden, "none", "block_norm"),
    Rule("mlp.mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"),
         lambda m: (2 * m.ffn_hidden_size, m.hidden_size), transform=GATED),
    Rule("mlp.mlp.linear_fc2.weight", ("mlp.down_proj.weight",), lambda m: (m.hidden_size, m.ffn_hidden_size)),
    Rule("mlp.post_feedforward_layernorm.weight", ("post_feedforward_layernorm.weight",), hidden, "none", "norm"),
)
_EXPERTS_FC1, _EXPERTS_FC2 = "mlp.moe.experts.experts.linear_fc1.weight", "mlp.moe.experts.experts.linear_fc2.weight"
MOE = (
    Rule("mlp.post_feedforward_layernorm_1.weight", ("post_feedforward_layernorm_1.weight",), hidden, "none", "norm"),
    Rule("mlp.moe.pre_feedforward_layernorm_2.weight", ("pre_feedforward_layernorm_2.weight",), hidden, "none",
         "norm"),
    Rule("mlp.moe.router.weight", ("router.proj.weight",), lambda m: (m.num_experts, m.hidden_size), "none"),
    Rule("mlp.moe.router.scale", ("router.scale",), hidden, "none", "norm"),
    Rule("mlp.moe.router.per_expert_scale", ("router.per_expert_scale",), lambda m: (m.num_experts,), "none", "norm"),
    Rule(_EXPERTS_FC1, ("experts.gate_up_proj",),
         lambda m: (2 * m.moe_ffn_hidden_size, m.hidden_size), experts=True, transform=StackedExperts()),
    Rule(_EXPERTS_FC2, ("experts.down_proj",),
         lambda m: (m.hidden_size, m.moe_ffn_hidden_size), experts=True, transform=StackedExperts()),
    Rule("mlp.post_feedforward_layernorm_2.weight", ("post_feedforward_layernorm_2.weight",), hidden, "none", "norm"),
)
_LAYER = re.compile(r"(?:decoder\.layers\.(\d+)|mtp(?:_heads)?\.layers\.\d+\.(?:transformer_layer|mtp_model_layer))\.")


def kind_of_prefix(model, prefix: str) -> str:
    """The layer kind of a megatron-core key or layer prefix (an MTP layer's: ``MTP_KIND``)."""
    match = _LAYER.match(prefix)
    if match is None:
        raise KeyError(prefix)
    return model.layer_kinds()[int(match.group(1))] if match.group(1) is not None else MTP_KIND


def rules_of_kind(model, kind: str, moe: bool) -> list[Rule]:
    """The tensors of one layer of ``kind``: no value projection where keys are values; the MoE block's
    tensors with ``moe``."""
    no_v = kind_shares_kv(model, kind)
    out = [r for r in ATTENTION[kind] if not (no_v and r.mcore == "self_attention.linear_v.weight")]
    return out + list(LAYER) + list(DENSE) + (list(MOE) if moe else [])


@dataclass(frozen=True)
class Gemma4Table(Table):
    """The tensor table whose layer rules follow each layer's kind (module note)."""

    def layer_rules(self, model, moe: bool, spec: Optional[Spec], kind: str = SLIDING) -> list[Rule]:
        return rules_of_kind(model, kind, moe)

    def _params_for_layer(self, mcore_prefix: str, hf_prefix: str, moe: bool, model, part, spec):
        for rule in rules_of_kind(model, kind_of_prefix(model, mcore_prefix), moe):
            yield rule.param(mcore_prefix, hf_prefix, part, model)

    def rule_for_key(self, key: str, model=None) -> Rule:
        if _LAYER.match(key) is None or model is None:  # the final norm, an MTP module's own tensors
            candidates = (*MTP_OWN, *ATTENTION[SLIDING], *LAYER, *DENSE, *MOE)
        else:
            candidates = rules_of_kind(model, kind_of_prefix(model, key), True)
        for rule in candidates:
            if key.endswith("." + rule.mcore):
                return rule
        raise KeyError(key)

    def registration(self, model, prefix: str, moe: bool, te: bool, local_experts) -> list[tuple[Rule, str]]:
        """(rule, module-relative name) of one layer's parameters in the order megatron-core registers them
        (plan/params.py): the attention, then the feed-forward block (the dense MLP, then the MoE block's
        router, its local experts (TE: all fc1, then all fc2; local: each expert's fc1 and fc2), and its
        expert-input norm), buffers left out."""
        rules = {r.mcore: r for r in rules_of_kind(model, kind_of_prefix(model, prefix), moe) if r.role != "buffer"}
        order = [r.mcore for r in ATTENTION[SLIDING] if r.mcore in rules]
        order += ["mlp.pre_feedforward_layernorm.weight", "mlp.mlp.linear_fc1.weight", "mlp.mlp.linear_fc2.weight"]
        out = [(rules[name], name) for name in order]
        if moe:
            fc1, fc2 = rules[_EXPERTS_FC1], rules[_EXPERTS_FC2]
            out += [(rules[n], n) for n in ("mlp.post_feedforward_layernorm_1.weight", "mlp.moe.router.weight",
                                            "mlp.moe.router.scale", "mlp.moe.router.per_expert_scale")]
            if te:
                out += [(fc1, f"mlp.moe.experts.linear_fc1.weight{i}") for i in local_experts]
                out += [(fc2, f"mlp.moe.experts.linear_fc2.weight{i}") for i in local_experts]
            else:
                for i in local_experts:
                    out += [(fc1, f"mlp.moe.experts.local_experts.{i}.linear_fc1.weight"),
                            (fc2, f"mlp.moe.experts.local_experts.{i}.linear_fc2.weight")]
            out += [(rules[n], n) for n in ("mlp.moe.pre_feedforward_layernorm_2.weight",
                                            "mlp.post_feedforward_layernorm_2.weight")]
        out.append((rules["mlp.post_feedforward_layernorm.weight"], "mlp.post_feedforward_layernorm.weight"))
        return out


TABLE = Gemma4Table(attention=(*ATTENTION[SLIDING], *ATTENTION["full_attention"]), attention_for=lambda m, s: [])
ATTENTION_ORDER = {True: tuple(r.mcore for r in ATTENTION[SLIDING]), False: tuple(r.mcore for r in ATTENTION[SLIDING])}
"""The attention block's parameters in registration order (both specs name them alike)."""
