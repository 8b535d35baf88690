"""KV caches for a batch of sequences, each with its own length, and the geometry of one forward.

Design note (batched decoding). A cache is per layer: named buffers ``[slots, capacity, dim]`` and
one length per slot. What the buffers hold is the attention type's business: MLA stores ``latent``
(``kv_lora_rank``, after ``kv_a_layernorm``) and ``k_rot`` (the shared rotary key, already rotated);
grouped-query attention stores ``k`` and ``v`` with the heads flattened into ``dim``. A slot is a
sequence's place in the batch; a finished sequence's slot is reset (length 0) for the next prompt.

A forward over several sequences is described once, by :class:`Rows`, and shared by every layer:
which slot each row is, where its new tokens start (its cache length) and how many it has. Rows
may have different counts (prefills of different prompts, a verify of K+1 tokens beside a plain
step, an MTP module catching up over each sequence's accepted tokens). Everything outside attention
runs on the *packed* tokens ``[N, hidden]`` (N = the sum of the counts): norms, projections and the
MoE never see a padding token, so the routed-expert counts are exact. Attention alone unpacks to
``[B, T, ...]`` (T = the largest count; right padding), writes each row's new entries at its slot's
end (:meth:`KVCache.write`), reads every row's entries padded to the longest span S, and masks key
j for query i of row b unless ``j <= start_b + i``: causal, and blind to other rows' longer spans and
to padding. Padding entries are written past a row's length, so they are never visible and the
next write overwrites them; buffers start at zero so no unwritten entry can be NaN (a masked key
still multiplies its value by 0). Rollback per sequence is ``truncate(length, slot)``: O(1).
``Rows.carried`` holds what one layer hands the later layers of the same forward (DSA's IndexShare: the
last full layer's top-k selection); a new forward starts it empty.
"""

from __future__ import annotations

from functools import cached_property

import torch


class Rows:
    """The rows of one batched forward: slots, start positions and new-token counts (see the note above).
    Index tensors are built on first use: batch-1 decoding, one row of one token, needs none of them."""

    def __init__(self, slots: list[int], starts: list[int], counts: list[int]) -> None:
        if not slots or len(slots) != len(starts) or len(slots) != len(counts) or min(counts) < 1:
            raise RuntimeError(f"bad batch rows: slots {slots}, starts {starts}, counts {counts}")
        self.slots, self.starts, self.counts = list(slots), list(starts), list(counts)
        self.width = t = max(counts)
        self.span = max(starts) + t
        self.packed = all(c == t for c in counts)
        self.contiguous = slots == list(range(slots[0], slots[0] + len(slots)))
        self.carried: dict[str, object] = {}
        """What a layer hands the later layers of this same forward (DSA's IndexShare: the last full layer's
        top-k, models/dsa/decoder.py)."""

    @cached_property
    def positions(self) -> torch.Tensor:
        """[B, T]: the position of each row's t-th new token (padding included)."""
        return torch.tensor(self.starts)[:, None] + torch.arange(self.width)

    @cached_property
    def flat_index(self) -> torch.Tensor:
        """Where the packed tokens sit in the flattened [B*T] padded layout."""
        valid = torch.arange(self.width)[None, :] < torch.tensor(self.counts)[:, None]
        return torch.nonzero(valid.flatten()).flatten()

    @cached_property
    def token_positions(self) -> torch.Tensor:
        """[N]: the position of every packed token."""
        if len(self.slots) == 1:
            return torch.arange(self.starts[0], self.starts[0] + self.width)
        flat = self.positions.flatten()
        return flat if self.packed else flat[self.flat_index]

    @cached_property
    def last_index(self) -> torch.Tensor | slice:
        """Each row's last token in packed order (indexes [N, ...] to [B, ...])."""
        if len(self.slots) == 1:
            return slice(self.width - 1, self.width)
        return torch.tensor(self.counts).cumsum(0) - 1

    @cached_property
    def slot_index(self) -> torch.Tensor:
        return torch.tensor(self.slots)

    @cached_property
    def mask(self) -> torch.Tensor | None:
        """[B, 1, T, S]: key j visible to query i of row b iff j <= start_b + i; None for one row of one
        token, which sees its whole cache (batch-1 decoding, as before batching)."""
        if len(self.slots) == 1 and self.width == 1:
            return None
        return (torch.arange(self.span)[None, None, :] <= self.positions[:, :, None]).unsqueeze(1)

    @property
    def tokens(self) -> int:
        return sum(self.counts)

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """[N, ...] -> [B, T, ...] (padding rows zero)."""
        b, t = len(self.slots), self.width
        if self.packed:
            return packed.view(b, t, *packed.shape[1:])
        out = packed.new_zeros(b * t, *packed.shape[1:])
        out[self.flat_index] = packed
        return out.view(b, t, *packed.shape[1:])

    def pack(self, padded: torch.Tensor) -> torch.Tensor:
        """[B, T, ...] -> [N, ...]."""
        flat = padded.reshape(-1, *padded.shape[2:])
        return flat if self.packed else flat[self.flat_index]

    def split(self, packed: torch.Tensor) -> list[torch.Tensor]:
        """[N, ...] -> one tensor per row."""
        return list(torch.split(packed, self.counts))


class KVCache:
    """Named buffers ``[slots, capacity, dim]`` of one attention layer, with a length per slot."""

    def __init__(self, dims: dict[str, int], dtype: torch.dtype, slots: int = 1, capacity: int = 256) -> None:
        self.dims, self.dtype = dict(dims), dtype
        self.buffers = {name: torch.zeros(slots, capacity, dim, dtype=dtype) for name, dim in self.dims.items()}
        self.lengths = [0] * slots

    @property
    def capacity(self) -> int:
        return next(iter(self.buffers.values())).shape[1]

    @property
    def length(self) -> int:
        """Slot 0's length (batch-1 decoding)."""
        return self.lengths[0]

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        for name, buf in self.buffers.items():
            grown = buf.new_zeros(buf.shape[0], new_cap, buf.shape[2])
            grown[:, : buf.shape[1]] = buf
            self.buffers[name] = grown

    def write(self, rows: Rows, new: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Write each row's new entries ``[B, T, dim]`` at its slot's end; return every row's entries
        ``[B, S, dim]`` (positions past a row's own are padding, hidden by ``rows.mask``)."""
        for slot, start in zip(rows.slots, rows.starts):
            if start != self.lengths[slot]:
                raise RuntimeError(f"cache write at {start} but slot {slot} holds {self.lengths[slot]} positions")
        if rows.span > self.capacity:
            self._grow(rows.span)
        out = {}
        for name, buf in self.buffers.items():
            if len(rows.slots) == 1:
                slot, start = rows.slots[0], rows.starts[0]
                buf[slot, start : start + rows.width] = new[name][0]
            else:
                buf[rows.slot_index[:, None], rows.positions] = new[name]
            if rows.contiguous:
                out[name] = buf[rows.slots[0] : rows.slots[0] + len(rows.slots), : rows.span]
            else:
                out[name] = buf[rows.slot_index, : rows.span]
        for slot, start, count in zip(rows.slots, rows.starts, rows.counts):
            self.lengths[slot] = start + count
        return out

    def truncate(self, length: int, slot: int = 0) -> None:
        """Forget slot's positions ``>= length`` (rollback to the accepted prefix)."""
        if length < 0 or length > self.lengths[slot]:
            raise RuntimeError(f"cannot truncate slot {slot} of {self.lengths[slot]} positions to {length}")
        self.lengths[slot] = length

    def read(self, name: str, slot: int = 0) -> torch.Tensor:
        """Slot's valid entries of one buffer, ``[length, dim]``."""
        return self.buffers[name][slot, : self.lengths[slot]]
