"""Drafting with the MTP module(s): which hidden state and token go in at which position,
and how the draft caches are rolled back after verification.

Sequence indices: ``seq[0..N-1]`` are committed tokens; ``seq[N-1]`` (the "pending" token) has
not been fed to the target yet, so the target cache holds positions ``0..N-2`` and ``h_0(t)``
(target hidden after the final norm) is known for ``t <= N-2``.

Draft step j (1..K) uses module ``m = min(j, D)`` and predicts ``seq[N-1+j]``:
- j <= D ("depth mode", megatron-core's own recipe): module m at position ``N-2`` with
  ``h_{m-1}(N-2)`` and token ``seq[N-2+m]``; before it, the module's cache is caught up over the
  positions it has not seen (the accepted tokens of the last round), in one forward.
- j > D ("chained", as the serving engines do for D=1): module D at position ``N-2+j-D`` with
  its OWN previous output and the previous draft token. These entries are never kept.

Depth-mode entries of module m at position t are exact (equal to what megatron computes on
the final sequence) while ``t + m <= N'-2`` for the new committed length ``N'``: the token
they consumed is committed and was not a rejected draft. :meth:`MTPDrafter.rollback` cuts each
module's cache to that length; the target-hidden buffer is cut to the target cache length.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, Protocol

import torch

from megatron_mtp.inference.mtp_module import MTPModule

#: Picks a draft token from draft logits; returns (token, q) where q is the distribution the
#: token was drawn from (None for greedy/argmax drafting).
PickFn = Callable[[torch.Tensor], tuple[int, torch.Tensor | None]]


class Drafter(Protocol):
    """What the generator needs from a draft model."""

    def reset(self) -> None: ...

    def observe_target(self, hidden: torch.Tensor, start: int) -> None: ...

    def propose(self, tokens: list[int], k: int, pick: PickFn) -> tuple[list[int], list[torch.Tensor | None]]: ...

    def rollback(self, committed: int) -> None: ...

    def cache_lengths(self) -> list[int]: ...


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


class MTPDrafter:
    """Drafts K tokens with D exported MTP modules (depth mode first, then chaining the last)."""

    def __init__(self, modules: list[MTPModule], chain_hidden: Literal["post_norm", "pre_norm"] = "post_norm") -> None:
        if not modules:
            raise ValueError("MTPDrafter needs at least one MTP module")
        self.modules = modules
        self.chain_hidden = chain_hidden
        width = modules[0].config.hidden_size
        dtype = modules[0].eh_proj.weight.dtype
        self._hidden = [HiddenBuffer(width, dtype) for _ in range(len(modules) + 1)]
        self._depth_len = [0] * (len(modules) + 1)  # index m = module m (1-based); [0] unused

    @property
    def depth(self) -> int:
        return len(self.modules)

    def reset(self) -> None:
        for module in self.modules:
            module.reset_cache()
        for buf in self._hidden:
            buf.truncate(0)
        self._depth_len = [0] * (self.depth + 1)

    def observe_target(self, hidden: torch.Tensor, start: int) -> None:
        """Record the target's post-norm hidden states for positions ``start..``."""
        self._hidden[0].truncate(start)
        self._hidden[0].write(start, hidden)

    @torch.inference_mode()
    def propose(self, tokens: list[int], k: int, pick: PickFn) -> tuple[list[int], list[torch.Tensor | None]]:
        n = len(tokens)
        anchor = n - 2  # last position whose target hidden state is known
        seq = list(tokens)
        drafts: list[int] = []
        dists: list[torch.Tensor | None] = []
        chained: torch.Tensor | None = None
        for j in range(1, k + 1):
            m = min(j, self.depth)
            module = self.modules[m - 1]
            assert module.cache is not None
            if j <= self.depth:
                start = self._depth_len[m]
                module.cache.truncate(start)
                hidden_in = self._hidden[m - 1].read(start, anchor + 1)
                post, pre, logits = module.step(hidden_in, seq[start + m : anchor + m + 1], start)
                self._hidden[m].truncate(start)
                self._hidden[m].write(start, post)
                self._depth_len[m] = anchor + 1
            else:
                assert chained is not None
                position = anchor + j - self.depth
                post, pre, logits = module.step(chained, [seq[n - 2 + j]], position)
            chained = (post if self.chain_hidden == "post_norm" else pre)[-1:]
            token, dist = pick(logits)
            seq.append(token)
            drafts.append(token)
            dists.append(dist)
        return drafts, dists

    def rollback(self, committed: int) -> None:
        """Keep only draft-cache entries that stay exact once ``committed`` tokens are final."""
        self._hidden[0].truncate(committed - 1)
        for m, module in enumerate(self.modules, start=1):
            keep = max(0, min(self._depth_len[m], committed - 1 - m))
            self._depth_len[m] = keep
            if module.cache is not None:
                module.cache.truncate(min(keep, module.cache.length))
            self._hidden[m].truncate(keep)

    def cache_lengths(self) -> list[int]:
        return [module.cache.length if module.cache is not None else 0 for module in self.modules]
