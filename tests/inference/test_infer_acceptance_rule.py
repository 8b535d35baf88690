"""The Leviathan acceptance rule on a small vocabulary with exact p and q: the emitted token must
be distributed as p (chi-square), for q = p, one-hot q, disjoint support and a random q."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chisquare

from megatron_mtp.inference.sampling import SamplingParams, draw, probabilities
from megatron_mtp.inference.verify import accept_or_resample, verify

VOCAB = 6
SAMPLES = 6000


def _emitted_counts(p: torch.Tensor, q: torch.Tensor, rule, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    counts = torch.zeros(VOCAB)
    for _ in range(SAMPLES):
        draft = draw(q, gen)
        _, token = rule(p, q, draft, gen)
        counts[token] += 1
    return counts


def _pvalue(counts: torch.Tensor, p: torch.Tensor) -> float:
    support = p > 0
    assert counts[~support].sum() == 0, "emitted a token the target gives probability 0"
    expected = p[support] * counts.sum()
    return float(chisquare(counts[support].numpy(), expected.numpy()).pvalue)


P = torch.tensor([0.05, 0.30, 0.25, 0.0, 0.15, 0.25])
CASES = {
    "q_equals_p": P.clone(),
    "one_hot_q": torch.tensor([0.0, 0.0, 0.0, 0.0, 1.0, 0.0]),
    "disjoint_support": torch.tensor([0.0, 0.0, 0.0, 1.0, 0.0, 0.0]),
    "random_q": torch.tensor([0.4, 0.05, 0.05, 0.2, 0.1, 0.2]),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_emitted_tokens_follow_p(case):
    counts = _emitted_counts(P, CASES[case], accept_or_resample)
    assert _pvalue(counts, P) > 1e-3


def test_chi_square_detects_a_lossy_rule():
    """The harness has power: exact-match acceptance (accept iff draft == argmax p) is not lossless."""

    def exact_match(p, q, draft, gen):
        if draft == int(torch.argmax(p)):
            return True, draft
        return False, draw(p, gen)

    counts = _emitted_counts(P, CASES["random_q"], exact_match)
    assert _pvalue(counts, P) < 1e-6


def test_q_equals_p_always_accepts():
    gen = torch.Generator().manual_seed(1)
    assert all(accept_or_resample(P, P, d, gen)[0] for d in (0, 1, 2, 4, 5))


def test_greedy_verify_accepts_matching_prefix_and_emits_target_token():
    logits = torch.full((4, VOCAB), -5.0)
    for row, best in enumerate([2, 4, 1, 3]):
        logits[row, best] = 5.0
    gen = torch.Generator()
    greedy = SamplingParams()
    assert verify(logits, [2, 4, 1], [None] * 3, greedy, gen) == (3, 3)  # all accepted + bonus
    assert verify(logits, [2, 0, 1], [None] * 3, greedy, gen) == (1, 4)  # first mismatch -> argmax
    assert verify(logits, [5, 4, 1], [None] * 3, greedy, gen) == (0, 2)


def test_top_k_top_p_filter_the_same_way_for_p_and_q():
    logits = torch.log(torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]))
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_k=3))
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0.15, 0, 0]) / 0.85)
    probs = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([0.5, 0.2, 0, 0, 0]) / 0.7)
    probs = probabilities(logits, SamplingParams(temperature=0.5))
    expected = torch.tensor([0.5, 0.2, 0.15, 0.1, 0.05]) ** 2
    assert torch.allclose(probs, expected / expected.sum())
