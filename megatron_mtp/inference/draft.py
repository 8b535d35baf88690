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
the final sequence) while ``t + m <= N'-2`` for the new committed length ``N'``: the token they
consumed is committed and was not a rejected draft. :meth:`MTPDrafter.rollback_rows` cuts each
module's cache to that length; the target-hidden buffer is cut to the target cache length.

Batches: every sequence has a slot (models/decoding/kv_cache.py) and its own N, depth lengths and hidden buffers;
``*_rows`` methods take the slots of a batch with, per sequence, its tokens and its own K (a sequence
near its token budget drafts fewer). Draft step j runs ONE forward over the sequences with K >= j,
each row catching up over its own positions (rows of different lengths); one prompt is a batch of one.
"""

from __future__ import annotations

from typing import Literal, Protocol

import torch

from megatron_mtp.inference.mtp_module import MTPParts
from megatron_mtp.models.decoding.drafting import HiddenBuffer, PickFn
from megatron_mtp.models.decoding.kv_cache import Rows


class Drafter(Protocol):
    """What the decode loop needs from a draft model: per slot (one entry per row of a batch), observe the
    target's hidden states, propose drafts, roll back to the committed tokens. A drafter that reads the outputs of
    some of the target's layers rather than its final-normed hidden state has a ``target_layers`` attribute naming
    them (ids as ``TargetModel.hand_layers`` takes them); ``observe_rows`` then receives those, concatenated."""

    def reset(self, slots: int = 1) -> None: ...

    def clear_slot(self, slot: int) -> None: ...

    def observe_rows(self, slots: list[int], hiddens: list[torch.Tensor], starts: list[int]) -> None: ...

    def propose_rows(self, slots: list[int], seqs: list[list[int]], ks: list[int], picks: list[PickFn]
                     ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]: ...

    def rollback_rows(self, slots: list[int], committed: list[int]) -> None: ...


class MTPDrafter:
    """Drafts K tokens with D exported MTP modules (depth mode first, then chaining the last)."""

    def __init__(self, modules: list[MTPParts], chain_hidden: Literal["post_norm", "pre_norm"] = "post_norm") -> None:
        if not modules:
            raise ValueError("MTPDrafter needs at least one MTP module")
        self.modules = modules
        self.chain_hidden = chain_hidden
        self.reset()

    @property
    def depth(self) -> int:
        return len(self.modules)

    def reset(self, slots: int = 1) -> None:
        width = self.modules[0].config.hidden_size
        dtype = self.modules[0].eh_proj.weight.dtype
        for module in self.modules:
            module.reset_cache(slots)
        # _hidden[m][slot]: h_m by position (m = 0: the target's); _depth_len[m][slot]: module m's exact prefix
        self._hidden = [[HiddenBuffer(width, dtype) for _ in range(slots)] for _ in range(self.depth + 1)]
        self._depth_len = [[0] * slots for _ in range(self.depth + 1)]  # index m = module m (1-based); [0] unused

    def clear_slot(self, slot: int) -> None:
        """Forget a finished sequence; its slot starts empty for the next prompt."""
        for m in range(self.depth + 1):
            self._hidden[m][slot].truncate(0)
            self._depth_len[m][slot] = 0
        for module in self.modules:
            assert module.cache is not None
            module.cache.truncate(0, slot)

    def observe_rows(self, slots: list[int], hiddens: list[torch.Tensor], starts: list[int]) -> None:
        """Record the target's post-norm hidden states of each slot from its ``start``."""
        for slot, hidden, start in zip(slots, hiddens, starts):
            self._hidden[0][slot].truncate(start)
            self._hidden[0][slot].write(start, hidden)

    @torch.inference_mode()
    def propose_rows(self, slots: list[int], seqs: list[list[int]], ks: list[int], picks: list[PickFn]
                     ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        ext = [list(seq) for seq in seqs]  # committed tokens, then this round's drafts
        drafts: list[list[int]] = [[] for _ in slots]
        dists: list[list[torch.Tensor | None]] = [[] for _ in slots]
        chained: list[torch.Tensor | None] = [None] * len(slots)
        for j in range(1, max(ks, default=0) + 1):
            live = [i for i, k in enumerate(ks) if k >= j]
            m = min(j, self.depth)
            module = self.modules[m - 1]
            assert module.cache is not None
            if j <= self.depth:  # depth mode: catch up over the unseen positions, ending at the anchor
                starts, counts, hidden_in, tokens = [], [], [], []
                for i in live:
                    slot, anchor = slots[i], len(seqs[i]) - 2  # anchor: last position with a target hidden state
                    start = self._depth_len[m][slot]
                    module.cache.truncate(start, slot)
                    hidden_in.append(self._hidden[m - 1][slot].read(start, anchor + 1))
                    tokens += ext[i][start + m : anchor + m + 1]
                    starts.append(start)
                    counts.append(anchor + 1 - start)
                rows = Rows([slots[i] for i in live], starts, counts)
                post, pre, logits = module.step_rows(rows, torch.cat(hidden_in), tokens)
                for i, start, out in zip(live, starts, rows.split(post)):
                    self._hidden[m][slots[i]].truncate(start)
                    self._hidden[m][slots[i]].write(start, out)
                    self._depth_len[m][slots[i]] = len(seqs[i]) - 1
            else:  # chained: module D one position further, on its own previous output and the last draft
                positions = [len(seqs[i]) - 2 + j - self.depth for i in live]
                rows = Rows([slots[i] for i in live], positions, [1] * len(live))
                hidden = torch.cat([chained[i] for i in live])  # type: ignore[misc]
                post, pre, logits = module.step_rows(rows, hidden, [ext[i][len(seqs[i]) - 2 + j] for i in live])
            outs = rows.split(post if self.chain_hidden == "post_norm" else pre)
            for r, i in enumerate(live):
                chained[i] = outs[r][-1:]
                token, dist = picks[i](logits[r])
                ext[i].append(token)
                drafts[i].append(token)
                dists[i].append(dist)
        return drafts, dists

    def rollback_rows(self, slots: list[int], committed: list[int]) -> None:
        """Keep only draft-cache entries that stay exact once ``committed`` tokens of each slot are final."""
        for slot, n in zip(slots, committed):
            self._hidden[0][slot].truncate(n - 1)
            for m, module in enumerate(self.modules, start=1):
                keep = max(0, min(self._depth_len[m][slot], n - 1 - m))
                self._depth_len[m][slot] = keep
                assert module.cache is not None
                module.cache.truncate(min(keep, module.cache.lengths[slot]), slot)
                self._hidden[m][slot].truncate(keep)

    def cache_lengths(self, slot: int = 0) -> list[int]:
        return [module.cache.lengths[slot] if module.cache is not None else 0 for module in self.modules]
