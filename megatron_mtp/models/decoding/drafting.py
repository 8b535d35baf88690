"""What every drafter shares with the decode loop (inference/draft.py's ``Drafter`` protocol): how it picks a
token (``PickFn``) and the target hidden states it keeps per position and rolls back (``HiddenBuffer``)."""

from __future__ import annotations

from collections.abc import Callable

import torch

#: Picks a draft token from draft logits; returns (token, q) where q is the distribution the
#: token was drawn from (None for greedy/argmax drafting).
PickFn = Callable[[torch.Tensor], tuple[int, torch.Tensor | None]]


class HiddenBuffer:
    """Hidden states by position, growable and truncatable."""

    def __init__(self, width: int, dtype: torch.dtype) -> None:
        self._data = torch.empty(64, width, dtype=dtype)
        self.length = 0

    def write(self, start: int, rows: torch.Tensor) -> None:
        end = start + rows.shape[0]
        if start > self.length:
            raise RuntimeError(f"hidden buffer write at {start} leaves a gap after {self.length}")
        if end > self._data.shape[0]:
            grown = torch.empty(max(end, 2 * self._data.shape[0]), self._data.shape[1], dtype=self._data.dtype)
            grown[: self.length] = self._data[: self.length]
            self._data = grown
        self._data[start:end] = rows
        self.length = end

    def read(self, start: int, end: int) -> torch.Tensor:
        if end > self.length:
            raise RuntimeError(f"hidden buffer read up to {end} but only {self.length} positions are known")
        return self._data[start:end]

    def truncate(self, length: int) -> None:
        self.length = min(self.length, max(length, 0))
