"""A per-layer MLA latent KV cache whose length can be cut back (rollback after verification).

MLA caches the compressed latent (``kv_lora_rank`` after ``kv_a_layernorm``) and the shared
rotary key (``qk_rope_head_dim``, already rotated), not per-head keys and values. Storage is a
preallocated buffer that doubles when full; ``length`` is the number of valid positions.
Rolling back is ``truncate(n)``: positions ``>= n`` are simply overwritten by the next write,
so a rejected draft costs nothing to undo.
"""

from __future__ import annotations

import torch


class LatentKVCache:
    """Latent (``kv_nope``) and rotary-key (``k_rot``) buffers for one attention layer, batch 1."""

    def __init__(self, latent_dim: int, rope_dim: int, dtype: torch.dtype, capacity: int = 256) -> None:
        self.latent_dim = latent_dim
        self.rope_dim = rope_dim
        self.dtype = dtype
        self._latent = torch.empty(1, 1, capacity, latent_dim, dtype=dtype)
        self._rope = torch.empty(1, 1, capacity, rope_dim, dtype=dtype)
        self.length = 0

    @property
    def capacity(self) -> int:
        return self._latent.shape[2]

    def _grow(self, needed: int) -> None:
        new_cap = max(needed, 2 * self.capacity)
        latent = torch.empty(1, 1, new_cap, self.latent_dim, dtype=self.dtype)
        rope = torch.empty(1, 1, new_cap, self.rope_dim, dtype=self.dtype)
        latent[:, :, : self.length] = self._latent[:, :, : self.length]
        rope[:, :, : self.length] = self._rope[:, :, : self.length]
        self._latent, self._rope = latent, rope

    def append(self, latent: torch.Tensor, rope: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Write ``T`` new positions at ``start`` (must equal ``length``); return views of all valid ones."""
        if start != self.length:
            raise RuntimeError(f"cache write at {start} but cache holds {self.length} positions")
        end = start + latent.shape[2]
        if end > self.capacity:
            self._grow(end)
        self._latent[:, :, start:end] = latent
        self._rope[:, :, start:end] = rope
        self.length = end
        return self._latent[:, :, :end], self._rope[:, :, :end]

    def truncate(self, length: int) -> None:
        """Forget every position ``>= length`` (rollback to the accepted prefix)."""
        if length < 0 or length > self.length:
            raise RuntimeError(f"cannot truncate a cache of {self.length} positions to {length}")
        self.length = length
