"""What one generation returns, and the token-by-token check of when it ends (the decode loop's,
batch_generate.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from megatron_mtp.inference.stats import GenerationStats


@dataclass
class GenerationResult:
    """Generated text (EOS dropped, cut before a stop string), token ids, and statistics."""

    text: str
    tokens: list[int]
    stats: GenerationStats = field(default_factory=GenerationStats)

    def to_dict(self) -> dict[str, Any]:
        return {"text": self.text, "tokens": self.tokens, "stats": self.stats.to_dict()}


class Output:
    """Collects emitted tokens and decides, token by token, when generation ends."""

    def __init__(self, generator: Any, max_new: int, stop: list[str], eos: set[int]) -> None:
        self.g = generator
        self.max_new = max_new
        self.stop = stop
        self.eos = eos
        self.tokens: list[int] = []
        self.finish_reason = ""
        self._cut_text: str | None = None

    def push(self, token: int) -> bool:
        """Append one token; True when generation must end with it."""
        self.tokens.append(token)
        if token in self.eos:
            self.finish_reason = "eos"
            return True
        if self.stop:
            text = self.g.decode(self.tokens)
            hits = [i for i in (text.find(s) for s in self.stop) if i >= 0]
            if hits:
                self.finish_reason = "stop"
                self._cut_text = text[: min(hits)]
                return True
        if len(self.tokens) >= self.max_new:
            self.finish_reason = "length"
            return True
        return False

    def text(self) -> str:
        if self._cut_text is not None:
            return self._cut_text
        body = self.tokens[:-1] if self.finish_reason == "eos" else self.tokens
        return self.g.decode(body) if self.g.tokenizer is not None else ""
