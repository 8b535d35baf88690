"""The routed experts each forward touched: counted by the MoE layers, checked against the routers."""

from __future__ import annotations

import pytest

from megatron_mtp.inference.expert_counts import uniform_distinct
from megatron_mtp.models.decoding.layers import Router

PROMPT = "def add(a, b):\n    return"


def test_counts_equal_a_direct_count_of_the_routers_top_k(gen_d1):
    """A forward hook on every router records its top-k indices; per kind of forward, the distinct
    experts of each call must average to what generate reports."""
    calls: list[tuple[int, int]] = []  # (tokens, distinct) per router call, in order

    def hook(module, inputs, output):
        idx = output[0]
        calls.append((idx.shape[0], len(set(idx.flatten().tolist()))))

    routers = [m for owner in (gen_d1.target, *gen_d1.drafter.modules) for m in owner.modules()
               if isinstance(m, Router)]
    handles = [r.register_forward_hook(hook) for r in routers]
    try:
        result = gen_d1.generate(PROMPT, max_new_tokens=24, ignore_eos=True, speculative_k=2)
    finally:
        for h in handles:
            h.remove()
    e = result.stats.experts
    assert {"verify", "draft"} <= set(e)
    counted = sum(e[k]["layer_forwards"] for k in ("plain", "verify", "draft") if k in e)
    target_moe_layers = sum(isinstance(m, Router) for m in gen_d1.target.modules())
    assert counted == len(calls) - target_moe_layers >= 1  # all but the target's prefill
    rest = calls[target_moe_layers:]  # in call order: the prefill comes first
    kinds = [e[k] for k in ("plain", "verify", "draft") if k in e]
    assert sum(k["layer_forwards"] * k["distinct_experts"] for k in kinds) == sum(d for _, d in rest)
    assert sum(k["layer_forwards"] * k["tokens"] for k in kinds) == sum(t for t, _ in rest)
    # verifying K+1 tokens touches more experts than one decode token, and no more than the uniform bound allows
    assert e["verify"]["distinct_experts"] > e["topk"]
    # K + 1 = 3 tokens per verify (2 in a last, shortened round)
    assert uniform_distinct(e["num_experts"], e["topk"], 2) <= e["verify"]["uniform_expectation"] <= uniform_distinct(
        e["num_experts"], e["topk"], 3)
    assert e["expert_bytes_per_token"] > 0
    assert any("routed experts per MoE layer" in line for line in result.stats.summary_lines())


def test_plain_decoding_touches_top_k_experts_per_token(gen_d1):
    result = gen_d1.generate(PROMPT, max_new_tokens=8, ignore_eos=True)
    plain = result.stats.experts["plain"]
    assert plain["tokens"] == 1 and plain["distinct_experts"] == result.stats.experts["topk"]


def test_batched_counts_equal_a_direct_count_of_the_routers_top_k(gen_d1):
    """Four prompts of different lengths decoded together (one prefill forward, then rounds over up to 4
    sequences): the counts generate_batch reports equal the routers' own top-k indices on the same tokens,
    and no padding token reaches a router (a verify forward of 4 sequences routes exactly 4·(K+1) tokens)."""
    calls: list[tuple[int, int]] = []

    def hook(module, inputs, output):
        idx = output[0]
        calls.append((idx.shape[0], len(set(idx.flatten().tolist()))))

    routers = [m for owner in (gen_d1.target, *gen_d1.drafter.modules) for m in owner.modules()
               if isinstance(m, Router)]
    handles = [r.register_forward_hook(hook) for r in routers]
    prompts = [PROMPT, "for i in range(10):", "x", "class Node:\n    def __init__(self, value):"]
    try:
        batch = gen_d1.generate_batch(prompts, batch_size=4, max_new_tokens=[12, 7, 16, 9], speculative_k=2,
                                      ignore_eos=True)
    finally:
        for h in handles:
            h.remove()
    e = batch.stats.experts
    target_moe_layers = sum(isinstance(m, Router) for m in gen_d1.target.modules())
    prefill_tokens = sum(len(gen_d1.encode(p)) for p in prompts)
    assert [t for t, _ in calls[:target_moe_layers]] == [prefill_tokens] * target_moe_layers  # one prefill forward
    rest = calls[target_moe_layers:]
    kinds = [e[k] for k in ("plain", "verify", "draft") if k in e]
    assert sum(k["layer_forwards"] for k in kinds) == len(rest)
    assert sum(k["layer_forwards"] * k["distinct_experts"] for k in kinds) == pytest.approx(sum(d for _, d in rest))
    assert sum(k["layer_forwards"] * k["tokens"] for k in kinds) == pytest.approx(sum(t for t, _ in rest))
    verify_tokens = [t for t, _ in rest if t == 4 * 3]
    assert len(verify_tokens) >= target_moe_layers  # the first rounds verify 4 sequences × (K+1) tokens
    assert e["verify"]["distinct_experts"] > e["plain"]["distinct_experts"] >= e["topk"]
    assert len(batch.stats.acceptance_per_sequence) == 4 and batch.stats.tokens_per_decode_forward > 1
