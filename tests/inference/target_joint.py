"""The target's exact joint distribution of the next few tokens, and the chi-square test of sampled
sequences against it (shared by the speculative-sampling tests of both MTP styles)."""

from __future__ import annotations

import torch
from scipy.stats import chisquare

from megatron_mtp.inference.sampling import SamplingParams, probabilities


def exact_joint(gen, prompt_ids: list[int], params: SamplingParams, depth: int) -> dict[tuple, float]:
    """P(x1..x_depth | prompt) under the target's sampling distribution, for every sequence it allows."""
    joint = {(): 1.0}
    for _ in range(depth):
        grown = {}
        for prefix, prob in joint.items():
            gen.target.reset_cache()
            logits, _ = gen.target.forward(prompt_ids + list(prefix), last_only=True)
            p = probabilities(logits[-1], params)
            for x in torch.nonzero(p).flatten().tolist():
                grown[prefix + (x,)] = prob * float(p[x])
        joint = grown
    return joint


def joint_pvalue(counts: dict[tuple, int], joint: dict[tuple, float]) -> float:
    """Chi-square p-value of the sampled `counts` against `joint`. The expected counts are scaled to
    the observed total: the exact joint sums to 1 only up to float rounding (~1e-7), which scipy
    refuses as a mismatch of totals."""
    cells = sorted(joint)
    observed = [counts.get(c, 0) for c in cells]
    scale = sum(observed) / sum(joint.values())
    return float(chisquare(observed, [joint[c] * scale for c in cells]).pvalue)


def first_tokens_counts(results, depth: int) -> dict[tuple, int]:
    """How often each sequence of the first ``depth`` generated tokens occurs among ``results``."""
    counts: dict[tuple, int] = {}
    for result in results:
        key = tuple(result.tokens[:depth])
        counts[key] = counts.get(key, 0) + 1
    return counts


def batched_sampling_pvalue(gen, prompt_ids: list[int], params: dict, samples: int, depth: int = 3):
    """Decode ``samples`` copies of the prompt 16 at a time, drafting K=2, and test their first ``depth`` tokens
    against the target's exact joint: asserts no emitted sequence lies outside its support, and returns the batch
    (its stats) and the chi-square p-value."""
    joint = exact_joint(gen, prompt_ids, SamplingParams(**params), depth=depth)
    batch = gen.generate_batch([prompt_ids] * samples, batch_size=16, max_new_tokens=depth + 1, speculative_k=2,
                               ignore_eos=True, **params)
    counts = first_tokens_counts(batch.results, depth)
    assert set(counts) <= set(joint), "emitted a sequence the target gives probability 0"
    return batch, joint_pvalue(counts, joint)
