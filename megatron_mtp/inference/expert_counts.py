"""Which routed experts each forward touched, by kind of forward (plain decode, verify, draft).

Verifying K+1 tokens routes them to more distinct experts than one decode token, so a verify
forward reads more expert weights: for a MoE model this, not FLOPs, decides whether drafting pays
at small batches (`megatron-mtp plan --speculative` predicts it for a GPU). Every MoE layer reports
(tokens, distinct experts) of each forward to the counter while a phase is set; the summary puts the
measured mean beside the uniform-routing expectation E·(1−(1−k/E)^T) and gives the expert-weight
bytes read per committed token.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import Any, Iterator

from torch import nn

from megatron_mtp.models.expert_reach import distinct_experts as uniform_distinct

PHASES = ("plain", "verify", "draft")


def _roots(obj: Any) -> Iterator[nn.Module]:
    if isinstance(obj, nn.Module):
        yield obj
    elif isinstance(obj, (list, tuple)):
        for item in obj:
            yield from _roots(item)
    elif obj is not None and hasattr(obj, "__dict__"):
        for value in vars(obj).values():
            if isinstance(value, (nn.Module, list, tuple)):
                yield from _roots(value)


class ExpertCounts:
    """Attach with `attach(target, drafter)`; set the phase around forwards with `phase(name)`."""

    def __init__(self) -> None:
        self.current: str | None = None
        self.rows: dict[str, list[tuple[int, int]]] = {p: [] for p in PHASES}
        self.num_experts = self.topk = self.expert_params = 0

    def attach(self, *owners: Any) -> None:
        for owner in owners:
            for root in _roots(owner):
                for module in root.modules():
                    if hasattr(module, "expert_recorder"):
                        module.expert_recorder = self.record
                        self.num_experts, self.topk = module.num_experts, module.top_k
                        self.expert_params = module.expert_params()

    def record(self, tokens: int, distinct: int) -> None:
        if self.current is not None:
            self.rows[self.current].append((tokens, distinct))

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        before, self.current = self.current, name
        try:
            yield
        finally:
            self.current = before

    def summary(self, committed_tokens: int, weight_bytes: int) -> dict:
        """Per phase: MoE-layer forwards, mean tokens and distinct experts (measured and uniform), and
        the expert-weight bytes all forwards read per committed token."""
        out: dict = {"num_experts": self.num_experts, "topk": self.topk}
        total = 0
        for name, rows in self.rows.items():
            if not rows:
                continue
            n = len(rows)
            total += sum(d for _, d in rows)
            out[name] = {
                "layer_forwards": n,
                "tokens": sum(t for t, _ in rows) / n,
                "distinct_experts": sum(d for _, d in rows) / n,
                "uniform_expectation": sum(uniform_distinct(self.num_experts, self.topk, t) for t, _ in rows) / n,
            }
        out["expert_bytes_per_token"] = (total * self.expert_params * weight_bytes / committed_tokens
                                         if committed_tokens else 0.0)
        return out


def expert_line(e: dict) -> str:
    """One line of `--stats` for a summary of :meth:`ExpertCounts.summary`."""
    kinds = ", ".join(f"{name} {e[name]['tokens']:.1f} tokens → {e[name]['distinct_experts']:.2f} "
                      f"(uniform {e[name]['uniform_expectation']:.2f})" for name in PHASES if name in e)
    return (f"routed experts per MoE layer and forward, of {e['num_experts']} (top-{e['topk']}): {kinds}; "
            f"expert weights read per new token: {e['expert_bytes_per_token'] / 2**20:.2f} MiB")
