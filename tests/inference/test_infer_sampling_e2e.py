"""Sampling end to end through the generator: the first two tokens drawn with MTP drafting
(a K=1 round drafts and verifies the second token) follow the exact target distribution."""

from __future__ import annotations

import pytest
import torch
from infer_tiny_model import NoisyTargetDraft
from scipy.stats import chisquare

from megatron_mtp.inference.sampling import SamplingParams, probabilities

PROMPT = "for i in range(10):"
PARAMS = {"temperature": 1.3, "top_k": 4}
SAMPLES = 800


def _exact_joint(gen, prompt_ids):
    params = SamplingParams(**PARAMS)
    gen.target.reset_cache()
    logits, _ = gen.target.forward(prompt_ids, last_only=True)
    p1 = probabilities(logits[-1], params)
    joint = {}
    for x1 in torch.nonzero(p1).flatten().tolist():
        gen.target.reset_cache()
        logits, _ = gen.target.forward(prompt_ids + [x1], last_only=True)
        p2 = probabilities(logits[-1], params)
        for x2 in torch.nonzero(p2).flatten().tolist():
            joint[(x1, x2)] = float(p1[x1] * p2[x2])
    return joint


def _counts(gen, prompt_ids, drafter):
    counts = {}
    accepted = 0
    for seed in range(SAMPLES):
        # 3 tokens: the first from the prefill, the second from a K=1 round (drafted, then verified)
        result = gen.generate(prompt_ids, max_new_tokens=3, seed=seed, speculative_k=1, ignore_eos=True,
                              drafter=drafter, **PARAMS)
        assert result.stats.rounds == 1
        key = tuple(result.tokens[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += result.stats.accepted[0]
    return counts, accepted / SAMPLES


@pytest.mark.parametrize("draft", ["mtp", "noisy-target"])
def test_speculative_sampling_matches_target_distribution(gen_d1, draft):
    prompt_ids = gen_d1.encode(PROMPT)
    joint = _exact_joint(gen_d1, prompt_ids)
    drafter = NoisyTargetDraft(gen_d1.target) if draft == "noisy-target" else None
    counts, acceptance = _counts(gen_d1, prompt_ids, drafter)
    if draft == "noisy-target":  # both branches of the rule are exercised
        assert 0.2 < acceptance < 0.9
    assert set(counts) <= set(joint), "emitted a pair the target gives probability 0"
    cells = sorted(joint)
    observed = [counts.get(c, 0) for c in cells]
    expected = [joint[c] * SAMPLES for c in cells]
    scale = sum(observed) / sum(expected)  # guard against float drift in the exact joint
    pvalue = chisquare(observed, [e * scale for e in expected]).pvalue
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_draft_distribution_differs_from_target(gen_d1):
    """Guard that the test above exercises rejection: the random MTP draft is not the target."""
    prompt_ids = gen_d1.encode(PROMPT)
    result = gen_d1.generate(prompt_ids, max_new_tokens=30, seed=0, speculative_k=1, ignore_eos=True, **PARAMS)
    assert result.stats.acceptance_rate < 0.9
