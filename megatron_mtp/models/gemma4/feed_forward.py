"""Gemma 4's feed-forward block as a megatron-core module: a dense MLP and, beside it, an MoE block,
each with its own norms, summed and normed once more (its spec: models/gemma4/specs.py).

Design note. For x the residual stream entering the block (the layer's pre-MLP norm is an identity):
  dense = post_norm_1(MLP(pre_norm(x)))            (post_norm_1 only with the MoE block)
  moe   = post_norm_2(Σ_k w_k·E_k(pre_norm_2(x)))   w = top-k of softmax(router(x)), renormalised, × scale_e
  out   = post_norm(dense + moe)
The router reads x itself, not a normed copy: r(x) = W_r · (rmsnorm(x) ⊙ s · H^-1/2) with a learned s and
no weight in the norm, softmax over all experts, the top k renormalised (megatron-core's softmax top-k
with renormalisation computes the same), then each chosen weight times its expert's learned scale. So
``Gemma4Router`` is megatron-core's TopKRouter with that input map in ``gating`` and the scale in
``routing``, and ``Gemma4MoE`` is its MoELayer whose ``preprocess`` (after routing, before dispatch)
applies pre_norm_2 to the tokens the experts receive. Dispatch, expert parallelism, capacity and the
balance loss stay megatron-core's.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.moe_layer import MoELayer
from megatron.core.transformer.moe.router import TopKRouter
from torch import nn

from megatron_mtp.rms_norm import rms_norm


class Gemma4Router(TopKRouter):
    """TopKRouter over Gemma 4's router input, with the per-expert scale (module note)."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.scale = nn.Parameter(torch.ones(config.hidden_size, dtype=config.params_dtype))
        self.per_expert_scale = nn.Parameter(torch.ones(config.num_moe_experts, dtype=config.params_dtype))
        for p in (self.scale, self.per_expert_scale):
            p.sequence_parallel = bool(config.sequence_parallel)  # replicated over TP: its gradient is summed

    def gating(self, input: torch.Tensor):
        x = rms_norm(input, torch.ones((), device=input.device), self.config.layernorm_epsilon)
        return super().gating(x * self.scale * self.config.hidden_size ** -0.5)

    def routing(self, logits: torch.Tensor, *args, **kwargs):
        probs, routing_map = super().routing(logits, *args, **kwargs)
        return probs * self.per_expert_scale.to(probs.dtype), routing_map


class Gemma4MoE(MoELayer):
    """MoELayer whose experts read pre_feedforward_layernorm_2(x) while the router reads x."""

    def __init__(self, config, submodules, layer_number=None, pg_collection=None, norm=None, **extra):
        super().__init__(config=config, submodules=submodules, layer_number=layer_number, pg_collection=pg_collection,
                         **extra)
        self.pre_feedforward_layernorm_2 = norm(config=config, hidden_size=config.hidden_size,
                                                eps=config.layernorm_epsilon)

    def preprocess(self, hidden_states, probs, routing_map):
        return super().preprocess(self.pre_feedforward_layernorm_2(hidden_states), probs, routing_map)


@dataclass
class Gemma4FeedForwardSubmodules:
    norm: Any
    """The norm class (RMSNorm with a weight)."""
    dense: Any
    """megatron-core's MLPSubmodules of the dense MLP."""
    moe: Optional[Any] = None
    """megatron-core's MoESubmodules of the MoE block (router: Gemma4Router), or None for a dense model."""


class Gemma4FeedForward(MegatronModule):
    """The dense MLP and the MoE block of one Gemma 4 layer (module note); returns (out, None)."""

    def __init__(self, config, submodules: Gemma4FeedForwardSubmodules, pg_collection=None, is_mtp_layer=None, **_):
        super().__init__(config=config)
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.transformer.mlp import MLP

        pg_collection = pg_collection or ProcessGroupCollection.use_mpu_process_groups()
        norm = dict(config=config, hidden_size=config.hidden_size, eps=config.layernorm_epsilon)
        self.pre_feedforward_layernorm = submodules.norm(**norm)
        self.mlp = MLP(config, submodules.dense, tp_group=pg_collection.tp)
        self.moe = None
        if submodules.moe is not None:
            self.post_feedforward_layernorm_1 = submodules.norm(**norm)
            # megatron-core 0.19 tells an MTP layer's MoE apart (its balance loss is tracked on its own); 0.16 has no
            # such argument
            extra = {} if is_mtp_layer is None else {"is_mtp_layer": is_mtp_layer}
            self.moe = Gemma4MoE(config, submodules.moe, pg_collection=pg_collection, norm=submodules.norm, **extra)
            self.post_feedforward_layernorm_2 = submodules.norm(**norm)
        self.post_feedforward_layernorm = submodules.norm(**norm)

    def set_layer_number(self, layer_number: int) -> None:
        if self.moe is not None:
            self.moe.set_layer_number(layer_number)

    def forward(self, hidden_states: torch.Tensor, *args, padding_mask=None, **kwargs):
        out, _ = self.mlp(self.pre_feedforward_layernorm(hidden_states))
        if self.moe is not None:
            moe_kwargs = {} if padding_mask is None else {"padding_mask": padding_mask}
            routed, _ = self.moe(hidden_states, **moe_kwargs)
            out = self.post_feedforward_layernorm_1(out) + self.post_feedforward_layernorm_2(routed)
        return self.post_feedforward_layernorm(out), None


class FeedForwardBuilder:
    """What a TransformerLayer's ``mlp`` submodule is on both megatron-core lines: 0.16 builds it through
    ``build_module`` (reading ``module`` and ``submodules``; not a ModuleSpec, which it would warn about as an
    unknown MLP), 0.19 calls it with the layer's keywords."""

    def __init__(self, submodules: Gemma4FeedForwardSubmodules):
        self.module, self.submodules, self.params = Gemma4FeedForward, submodules, {}

    def __call__(self, **kwargs):
        return Gemma4FeedForward(submodules=self.submodules, **kwargs)


def moe_submodules(use_te: bool, num_experts: int, grouped_gemm: bool):
    """megatron-core's MoE submodules for this platform, with Gemma 4's router and no shared experts."""
    from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec

    spec = get_moe_module_spec(use_te=use_te, num_experts=num_experts, moe_grouped_gemm=grouped_gemm)
    subs = spec.submodules if hasattr(spec, "submodules") else spec.keywords["submodules"]
    return dataclasses.replace(subs, router=Gemma4Router, shared_experts=None)
