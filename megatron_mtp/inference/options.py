"""The options of a generation, checked once: where they are made (the CLI does so as it parses its
flags, before the model loads; the library's ``generate``/``generate_batch`` when called).

Each bad value is one sentence naming the ``megatron-mtp generate`` flag (the library's keyword is
the flag's name with underscores). What depends on the model (an MTP module to draft with, the
number of parallel heads, a tokenizer for stop strings, the position limit) is checked by
:meth:`DecodeOptions.for_model`, once the model is there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from megatron_mtp.errors import UserError
from megatron_mtp.inference.draft import Drafter
from megatron_mtp.inference.sampling import SamplingParams
from megatron_mtp.inference.target import TargetModel
from megatron_mtp.models.decoding.layers import HFConfig

MAX_SPECULATIVE_K = 16


class DecodingModel(Protocol):
    """What the decode loop and these checks use of a loaded model (``generate.Generator``)."""

    target: TargetModel
    drafter: Drafter | None
    tokenizer: Any | None
    source: Path

    @property
    def config(self) -> HFConfig: ...

    def decode(self, ids: list[int]) -> str: ...

    def prompt_ids(self, prompt: str | list[int], label: str = "the prompt") -> list[int]: ...


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_budget(max_new_tokens: Any, label: str = "--max-new-tokens") -> int:
    """A token budget: a whole number of at least 1 (``label`` names where it was given)."""
    if not _whole(max_new_tokens) or max_new_tokens < 1:
        raise UserError(f"{label} is {max_new_tokens!r}; it must be a whole number of at least 1.")
    return int(max_new_tokens)


@dataclass(frozen=True)
class DecodeOptions:
    """What every prompt of one run decodes with (the token budget is per prompt: :func:`check_budget`)."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    speculative_k: int = 0
    stop: Sequence[str] | None = ()  # kept as a tuple, empty strings dropped
    ignore_eos: bool = False
    batch_size: int = 1
    sampling: SamplingParams = field(init=False)

    def __post_init__(self) -> None:
        k = self.speculative_k
        if not _whole(k) or not 0 <= k <= MAX_SPECULATIVE_K:
            raise UserError(f"--speculative is {k!r}; it must be a whole number from 0 to {MAX_SPECULATIVE_K} "
                            "(0 for plain decoding).")
        if not _whole(self.batch_size) or self.batch_size < 1:
            raise UserError(f"--batch-size is {self.batch_size!r}; it must be a whole number of at least 1.")
        if not _whole(self.seed):
            raise UserError(f"--seed is {self.seed!r}; it must be a whole number.")
        object.__setattr__(self, "sampling", SamplingParams(temperature=float(self.temperature),
                                                            top_k=int(self.top_k), top_p=float(self.top_p)))
        object.__setattr__(self, "stop", tuple(s for s in (self.stop or ()) if s))

    def for_model(self, g: DecodingModel, drafter: Drafter | None) -> Drafter | None:
        """The drafter this run drafts with (None for plain decoding), refusing what the model cannot do."""
        if self.stop and g.tokenizer is None:
            raise UserError(f"{g.source} has no tokenizer.json, so stop strings cannot be matched; drop --stop.")
        if not self.speculative_k:
            return None
        if drafter is None:
            raise UserError(f"{g.source} has no MTP module, so --speculative cannot be used; "
                            "drop --speculative or export the model with its MTP weights.")
        limit = getattr(drafter, "max_draft", None)  # parallel heads draft one position each
        if limit is not None and self.speculative_k > limit:
            raise UserError(f"--speculative {self.speculative_k} asks for more draft tokens than the {limit} parallel "
                            f"MTP heads of {g.source} give (one position each); use K <= {limit}.")
        return drafter

    def check_length(self, g: DecodingModel, prompt_tokens: int, budget: int, label: str) -> None:
        """The prompt, its new tokens and the drafts of its last round fit the model's positions."""
        limit = g.config.max_position_embeddings
        if prompt_tokens + budget + self.speculative_k > limit:
            raise UserError(f"{label} has {prompt_tokens} tokens, which with {budget} new tokens and "
                            f"{self.speculative_k} drafts exceeds the model's {limit} positions "
                            "(max_position_embeddings); shorten it or lower --max-new-tokens.")

    def eos(self, g: DecodingModel) -> set[int]:
        """The tokens that end a sequence."""
        return set() if self.ignore_eos else set(g.config.eos_token_ids)
