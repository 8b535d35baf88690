"""Teacher-forced MTP acceptance/accuracy and the MoE load-balance metric, against direct counts."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.training.metrics import MTPMetrics
from megatron_mtp.training.moe_metrics import ExpertLoad, dropped_tokens, max_violation


def _direct(mtp_preds, main_pred, labels, mask):
    """Reference: loops over positions (what a person would count by hand)."""
    b, s = labels.shape
    out = []
    for k, draft in enumerate(mtp_preds, start=1):
        acc = cor = n = 0
        for i in range(b):
            for t in range(s - k):
                if mask[i, t + k]:
                    n += 1
                    acc += int(draft[i, t] == main_pred[i, t + k])
                    cor += int(draft[i, t] == labels[i, t + k])
        out.append((acc, cor, n))
    return out


def test_acceptance_and_accuracy_match_direct_count():
    torch.manual_seed(0)
    b, s, v, depth = 3, 12, 7, 2
    labels = torch.randint(0, v, (b, s))
    mask = (torch.rand(b, s) > 0.2).float()
    metrics = MTPMetrics(depth, tp_group=None)
    metrics.start_microbatch(labels, mask)
    logits = [torch.randn(s, b, v) for _ in range(depth + 1)]  # D MTP calls, then the main model
    for lg in logits:
        metrics.output_hook(None, None, (lg, None))
    preds = [lg.argmax(-1).t() for lg in logits]
    expected = _direct(preds[:depth], preds[depth], labels, mask)
    for k, (acc, cor, n) in enumerate(expected):
        assert metrics.sums["accepted"][k] == acc
        assert metrics.sums["correct"][k] == cor
        assert metrics.sums["judged"][k] == n


def test_perfect_draft_is_fully_accepted():
    b, s, v = 2, 8, 5
    labels = torch.randint(0, v, (b, s))
    metrics = MTPMetrics(1, tp_group=None)
    metrics.start_microbatch(labels, torch.ones(b, s))
    main = torch.randn(s, b, v)
    shifted = torch.roll(main, -1, dims=0)  # draft at t == main at t+1
    metrics.output_hook(None, None, (shifted, None))
    metrics.output_hook(None, None, (main, None))
    assert metrics.sums["accepted"][0] == metrics.sums["judged"][0] == b * (s - 1)


def test_max_violation():
    counts = torch.tensor([[10.0, 10, 10, 10], [40, 0, 0, 0], [0, 0, 0, 0]], dtype=torch.float64)
    # layer 0 balanced (0), layer 1 all on one expert (4x mean -> 3), unused layer ignored
    assert abs(max_violation(counts) - 1.5) < 1e-12


def test_dropped_tokens_follow_megatron_cores_capacity_rule():
    """The hook's kept counts, fed by megatron-core's own token dropping, give the dropped share a
    direct count gives: each expert keeps at most C = ceil(tokens × topk / experts × factor)."""
    import math

    pytest.importorskip("megatron.core")
    from megatron.core.transformer.moe.moe_utils import apply_router_token_dropping

    torch.manual_seed(0)
    tokens, experts, topk, factor = 64, 8, 2, 1.0
    logits = torch.randn(tokens, experts) + torch.linspace(0, 2, experts)  # skewed: some experts overflow
    scores, chosen = logits.softmax(-1).topk(topk, dim=-1)
    routing_map = torch.zeros(tokens, experts, dtype=torch.bool).scatter(1, chosen, True)
    probs = torch.zeros(tokens, experts).scatter(1, chosen, scores)
    capacity = math.ceil(tokens * topk / experts * factor)
    want = 1 - routing_map.sum(0).clamp(max=capacity).sum().item() / (tokens * topk)
    assert want > 0.05  # the case drops tokens
    for pad in (False, True):
        load = ExpertLoad(1, experts, topk, pad_to_capacity=pad)
        load.hook_for(0)(None, None, apply_router_token_dropping(probs, routing_map, topk, factor,
                                                                 pad_to_capacity=pad))
        assert load.counts[0].tolist() == routing_map.sum(0).clamp(max=capacity).double().tolist()
        got = dropped_tokens(load.counts.sum(dim=1), load.requests)
        assert got["moe/dropped_tokens"] == pytest.approx(want, abs=1e-12) == got["moe/dropped/layer_01"]
