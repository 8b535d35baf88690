"""What the MoE layers log each interval: load per layer, dropped tokens, the aux-free router's bias.

Design note. A forward hook on every megatron-core ``Router`` (attached in metric_hooks.py) sees its
output ``(probs, routing_map)`` for each micro-batch's tokens:
  - load: tokens kept per expert. With ``model.moe_pad_to_capacity`` the routing map is the capacity
    mask (padding included), so the kept tokens are the nonzero probabilities instead.
  - dropped tokens: each token asks for router_topk experts, so a layer's requests are tokens × topk;
    without a capacity every request is kept, with one the shortfall is what was dropped:
        dropped_share = 1 - kept / (tokens × topk).
Every token is routed on exactly one rank, so sums over all ranks are the global counts.
The expert bias (``model.router_enable_expert_bias``: DeepSeek-V3's aux-loss-free balancing) is a
buffer every rank of a stage holds the same copy of; each interval logs, per layer, its spread
(max - min: how far the updates have pushed experts apart) and overall its largest magnitude. Ranks
that hold a layer add its values and a count, so the all-reduced sum divided by the count is the
layer's value at every layout.
"""

from __future__ import annotations

import torch

from megatron_mtp.platform import all_reduce_sum


class ExpertLoad:
    """Per MoE layer: tokens kept per expert, expert requests (tokens × topk), and the routers whose
    expert bias is logged."""

    def __init__(self, num_layers_total: int, num_experts: int, topk: int = 1, pad_to_capacity: bool = False,
                 expert_bias: bool = False):
        self.counts = torch.zeros(num_layers_total, max(num_experts, 1), dtype=torch.float64)
        self.requests = torch.zeros(num_layers_total, dtype=torch.float64)
        self.topk, self.pad_to_capacity = topk, pad_to_capacity
        self.expert_bias = expert_bias and num_experts > 0
        """Whether the model's routers have an expert bias (the same on every rank: it decides an all-reduce)."""
        self.biased: list[tuple[int, torch.nn.Module]] = []
        """(layer index, router) of the routers with an expert bias."""

    def hook_for(self, layer_index: int):
        def hook(module, inputs, output):
            probs, routing_map = output[0], output[1]  # [tokens, experts]
            with torch.no_grad():
                if self.counts.device != routing_map.device:  # accumulate where routing runs: no sync
                    self.counts = self.counts.to(routing_map.device)
                    self.requests = self.requests.to(routing_map.device)
                kept = (probs != 0) if self.pad_to_capacity else routing_map
                self.counts[layer_index] += kept.sum(dim=0).double()
                self.requests[layer_index] += routing_map.shape[0] * self.topk

        return hook

    def watch_bias(self, layer_index: int, router: torch.nn.Module) -> None:
        if getattr(router, "expert_bias", None) is not None:
            self.biased.append((layer_index, router))

    def reset(self) -> None:
        self.counts.zero_()
        self.requests.zero_()

    def interval_values(self, with_dropped: bool) -> dict[str, float]:
        """The interval's MoE scalars (every rank must call: it all-reduces), then a reset."""
        loads = all_reduce_sum(self.counts.clone()).cpu()
        values = {"moe/max_violation": max_violation(loads), **layer_imbalance(loads)}
        if with_dropped:
            values.update(dropped_tokens(loads.sum(dim=1), all_reduce_sum(self.requests.clone()).cpu()))
        if self.expert_bias:
            values.update(self._bias_values())
        self.reset()
        return values

    def _bias_values(self) -> dict[str, float]:
        stats = torch.zeros(3, self.counts.shape[0], dtype=torch.float64)  # spread, |max|, holders
        for index, router in self.biased:
            bias = router.expert_bias.detach().double().cpu()
            stats[:, index] += torch.stack([bias.max() - bias.min(), bias.abs().max(), bias.new_ones(())])
        stats = all_reduce_sum(stats)
        held = stats[2] > 0
        if not bool(held.any()):
            return {}
        per_layer = stats[:2, held] / stats[2, held]
        out = {"moe/expert_bias_absmax": float(per_layer[1].max())}
        for index, spread in zip(held.nonzero().flatten().tolist(), per_layer[0].tolist()):
            out[f"moe/expert_bias_spread/layer_{index + 1:02d}"] = spread
        return out


def max_violation(counts: torch.Tensor) -> float:
    """Mean over MoE layers of (max expert load / mean expert load - 1)."""
    used = counts[counts.sum(dim=1) > 0]
    if used.numel() == 0:
        return 0.0
    mean = used.mean(dim=1)
    return float((used.max(dim=1).values / mean - 1).mean())


def layer_imbalance(counts: torch.Tensor) -> dict[str, float]:
    """'moe/imbalance/layer_NN': max expert load / mean expert load of each MoE layer that routed tokens
    (layer numbers from 1, MTP layers after the decoder's, as megatron-core counts them)."""
    out = {}
    for index in range(counts.shape[0]):
        load = counts[index]
        total = float(load.sum())
        if total > 0:
            out[f"moe/imbalance/layer_{index + 1:02d}"] = float(load.max()) / (total / load.numel())
    return out


def dropped_tokens(kept: torch.Tensor, requests: torch.Tensor) -> dict[str, float]:
    """'moe/dropped_tokens': the share of expert requests dropped over all MoE layers, and per layer
    'moe/dropped/layer_NN' (kept and requests per layer)."""
    used = requests > 0
    if not bool(used.any()):
        return {}
    out = {"moe/dropped_tokens": float(1 - kept[used].sum() / requests[used].sum())}
    for index in used.nonzero().flatten().tolist():
        out[f"moe/dropped/layer_{index + 1:02d}"] = float(1 - kept[index] / requests[index])
    return out
