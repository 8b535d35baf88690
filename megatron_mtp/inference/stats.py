"""Statistics of one generation: acceptance per draft position, accept length, costs, speed."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from megatron_mtp.inference.expert_counts import expert_line


@dataclass
class AcceptanceCounts:
    """Verification rounds and the drafts they judged and accepted per draft position (one sequence,
    or every sequence of a batch), with the ratios derived from them."""

    rounds: int = 0  # verification rounds
    round_tokens: int = 0  # tokens the rounds produced (accepted + 1 each), before EOS/length cuts
    reached: list[int] = field(default_factory=list)  # per draft position: rounds that judged it
    accepted: list[int] = field(default_factory=list)  # per draft position: rounds that accepted it

    def record_round(self, k: int, n_accepted: int) -> None:
        if len(self.reached) < k:
            self.reached.extend([0] * (k - len(self.reached)))
            self.accepted.extend([0] * (k - len(self.accepted)))
        for i in range(min(n_accepted + 1, k)):
            self.reached[i] += 1
        for i in range(n_accepted):
            self.accepted[i] += 1
        self.rounds += 1
        self.round_tokens += n_accepted + 1

    @property
    def acceptance_per_position(self) -> list[float]:
        """P(draft i accepted | drafts 1..i-1 accepted), i = 1..K."""
        return [a / r if r else 0.0 for a, r in zip(self.accepted, self.reached)]

    @property
    def acceptance_rate(self) -> float:
        """Pooled per-token acceptance: accepted / judged drafts (Leviathan's alpha estimate)."""
        judged = sum(self.reached)
        return sum(self.accepted) / judged if judged else 0.0

    @property
    def mean_accept_length(self) -> float:
        """Tokens emitted per verification round (accepted drafts + the target's token)."""
        return self.round_tokens / self.rounds if self.rounds else 0.0


@dataclass
class GenerationStats(AcceptanceCounts):
    """Counters filled while generating; derived ratios are properties (and appear in ``to_dict``)."""

    prompt_tokens: int = 0
    new_tokens: int = 0
    speculative_k: int = 0
    finish_reason: str = ""
    wall_time_s: float = 0.0
    prefill_time_s: float = 0.0
    target_forwards: int = 0  # including the prefill
    target_time_s: float = 0.0  # decode-phase target forwards only (no prefill)
    decode_forwards: int = 0
    draft_steps: int = 0
    draft_time_s: float = 0.0
    experts: dict = field(default_factory=dict)  # routed experts touched per forward kind (expert_counts.py)

    @property
    def tokens_per_target_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def draft_target_time_ratio(self) -> float:
        """Mean time of one draft step / mean time of one decode-phase target forward."""
        if not (self.draft_steps and self.decode_forwards and self.target_time_s > 0):
            return 0.0
        return (self.draft_time_s / self.draft_steps) / (self.target_time_s / self.decode_forwards)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("acceptance_per_position", "acceptance_rate", "mean_accept_length",
                     "tokens_per_target_forward", "draft_target_time_ratio", "tokens_per_s"):
            out[name] = getattr(self, name)
        return out

    def summary_lines(self) -> list[str]:
        lines = [
            f"new tokens: {self.new_tokens} in {self.wall_time_s:.3f} s ({self.tokens_per_s:.1f} tokens/s), "
            f"finish: {self.finish_reason}",
            f"target forwards: {self.target_forwards} ({self.tokens_per_target_forward:.2f} tokens per forward)",
        ]
        if self.speculative_k:
            per_pos = ", ".join(f"{a:.3f}" for a in self.acceptance_per_position)
            lines += [
                f"speculative K={self.speculative_k}: mean accept length {self.mean_accept_length:.3f}, "
                f"acceptance {self.acceptance_rate:.3f}, per position [{per_pos}]",
                f"draft/target time ratio: {self.draft_target_time_ratio:.3f}",
            ]
        if self.experts:
            lines.append(expert_line(self.experts))
        return lines
