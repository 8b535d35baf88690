"""Sampling end to end through the generator: the first two tokens drawn with MTP drafting
(a K=1 round drafts and verifies the second token) follow the exact target distribution."""

from __future__ import annotations

import pytest
from infer_tiny_model import NoisyTargetDraft
from target_joint import exact_joint, first_tokens_counts, joint_pvalue

from megatron_mtp.inference.sampling import SamplingParams

PROMPT = "for i in range(10):"
PARAMS = {"temperature": 1.3, "top_k": 4}
SAMPLES = 800


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
    joint = exact_joint(gen_d1, prompt_ids, SamplingParams(**PARAMS), depth=2)
    drafter = NoisyTargetDraft(gen_d1.target) if draft == "noisy-target" else None
    counts, acceptance = _counts(gen_d1, prompt_ids, drafter)
    if draft == "noisy-target":  # both branches of the rule are exercised
        assert 0.2 < acceptance < 0.9
    assert set(counts) <= set(joint), "emitted a pair the target gives probability 0"
    pvalue = joint_pvalue(counts, joint)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_draft_distribution_differs_from_target(gen_d1):
    """Guard that the test above exercises rejection: the random MTP draft is not the target."""
    prompt_ids = gen_d1.encode(PROMPT)
    result = gen_d1.generate(prompt_ids, max_new_tokens=30, seed=0, speculative_k=1, ignore_eos=True, **PARAMS)
    assert result.stats.acceptance_rate < 0.9


def _batched_counts(gen, prompt_ids, depth, k, **params):
    """SAMPLES copies of the prompt, 16 at a time: rounds verify 16 sequences at once, each accepting its own
    number of drafts, each sampling with its own generator; drafts from a noisy copy of the target."""
    batch = gen.generate_batch([prompt_ids] * SAMPLES, batch_size=16, max_new_tokens=depth + 1, speculative_k=k,
                               ignore_eos=True, drafter=NoisyTargetDraft(gen.target), **params)
    return first_tokens_counts(batch.results, depth), batch.stats


def test_batched_speculative_sampling_matches_target_distribution(gen_d1):
    """Three tokens: the prefill's, then a K=2 round (two drafts verified), per sequence of a batch of 16."""
    prompt_ids = gen_d1.encode(PROMPT)
    joint = exact_joint(gen_d1, prompt_ids, SamplingParams(**PARAMS), depth=3)
    counts, stats = _batched_counts(gen_d1, prompt_ids, 3, 2, **PARAMS)
    assert stats.verify_forwards >= SAMPLES // 16 and 0.2 < stats.acceptance_rate < 0.9  # both branches of the rule
    assert set(counts) <= set(joint), "emitted a pair the target gives probability 0"
    pvalue = joint_pvalue(counts, joint)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_batched_chi_square_sees_a_lossy_rule(gen_d1, monkeypatch):
    """Guard: accepting every draft the target's top-k allows (the draft distribution leaks) fails the test."""
    import torch

    import megatron_mtp.inference.batch_generate as batch_module
    from megatron_mtp.inference.sampling import probabilities

    def accept_in_support(target_logits, drafts, dists, params, generator):
        p_rows = probabilities(target_logits, params)
        for i, token in enumerate(drafts):
            if p_rows[i][token] == 0:
                return i, int(torch.multinomial(p_rows[i], 1, generator=generator))
        return len(drafts), int(torch.multinomial(p_rows[len(drafts)], 1, generator=generator))

    monkeypatch.setattr(batch_module, "verify", accept_in_support)
    prompt_ids = gen_d1.encode(PROMPT)
    joint = exact_joint(gen_d1, prompt_ids, SamplingParams(**PARAMS), depth=3)
    counts, _ = _batched_counts(gen_d1, prompt_ids, 3, 2, **PARAMS)
    assert joint_pvalue(counts, joint) < 1e-3
