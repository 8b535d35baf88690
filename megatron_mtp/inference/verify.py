"""Verification of K draft tokens against one target forward over [pending, d_1..d_K].

Row i of the target output predicts the token after position i, so row i-1 judges draft d_i and
row K gives the bonus token when every draft is accepted.

Greedy: accept d_i while it equals argmax(row i-1); at the first mismatch emit that argmax.

Sampling (Leviathan et al. 2023, lossless): for each i in order, with p = target and q = draft
distributions (both after the same temperature/top-k/top-p), accept d_i ~ q with probability
min(1, p(d_i)/q(d_i)); on the first rejection emit a token from norm(max(p - q, 0)) and stop.
Then P(emit x) = q(x)·min(1, p/q) + (1 - Σ_y min(p, q))·max(p-q,0)(x)/Σ max(p-q,0)
             = min(p, q)(x) + max(p - q, 0)(x) = p(x).
"""

from __future__ import annotations

import torch

from megatron_mtp.inference.sampling import SamplingParams, draw, probabilities


def accept_or_resample(
    p: torch.Tensor, q: torch.Tensor, draft: int, generator: torch.Generator
) -> tuple[bool, int]:
    """One Leviathan step: (True, draft) if accepted, else (False, token from the residual)."""
    px, qx = float(p[draft]), float(q[draft])
    u = float(torch.rand((), generator=generator))
    if qx > 0 and u * qx < px:  # u < p/q without dividing; p >= q always accepts
        return True, draft
    residual = torch.clamp(p - q, min=0)
    total = float(residual.sum())
    if total <= 0:  # p == q up to rounding: the rejection had probability ~0; fall back to p
        return False, draw(p, generator)
    return False, draw(residual / total, generator)


def verify(
    target_logits: torch.Tensor,
    drafts: list[int],
    draft_dists: list[torch.Tensor | None],
    params: SamplingParams,
    generator: torch.Generator,
) -> tuple[int, int]:
    """Return (number of accepted drafts, the token emitted after them)."""
    if params.greedy:
        choices = torch.argmax(target_logits, dim=-1).tolist()
        for i, token in enumerate(drafts):
            if token != choices[i]:
                return i, int(choices[i])
        return len(drafts), int(choices[len(drafts)])
    p_rows = probabilities(target_logits, params)
    for i, token in enumerate(drafts):
        q = draft_dists[i]
        if q is None:
            raise ValueError("sampling verification needs the draft distribution q for every draft")
        accepted, emitted = accept_or_resample(p_rows[i], q, token, generator)
        if not accepted:
            return i, emitted
    return len(drafts), draw(p_rows[len(drafts)], generator)
