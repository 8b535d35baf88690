"""The target (main) model: embedding, decoder layers with latent KV caches, final norm, LM head.

``forward`` returns both the logits and the hidden state AFTER the final norm (``model.norm``):
that is ``h_0``, the input megatron-core's MTP depth 1 was trained on.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_mtp.inference.dims import DeepseekV3Dims
from megatron_mtp.inference.kv_cache import LatentKVCache
from megatron_mtp.inference.layers import DecoderLayer, RMSNorm, Rotary


class _Body(nn.Module):
    """``model.*`` of the HF layout."""

    def __init__(self, dims: DeepseekV3Dims) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(dims.vocab_size, dims.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(dims, i) for i in range(dims.num_hidden_layers))
        self.norm = RMSNorm(dims.hidden_size, dims.rms_norm_eps)


class TargetModel(nn.Module):
    """DeepSeek-V3 main model for batch-1 decoding with a rollback-able cache."""

    def __init__(self, dims: DeepseekV3Dims) -> None:
        super().__init__()
        self.dims = dims
        self.model = _Body(dims)
        self.lm_head = nn.Linear(dims.hidden_size, dims.vocab_size, bias=False)
        self.rotary = Rotary(dims.rope, dims.qk_rope_head_dim)
        self.caches: list[LatentKVCache] = []

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def reset_cache(self) -> None:
        self.caches = [
            LatentKVCache(self.dims.kv_lora_rank, self.dims.qk_rope_head_dim, self.dtype)
            for _ in range(self.dims.num_hidden_layers)
        ]

    @property
    def cache_length(self) -> int:
        return self.caches[0].length if self.caches else 0

    def truncate_cache(self, length: int) -> None:
        for cache in self.caches:
            cache.truncate(length)

    @torch.inference_mode()
    def forward(self, token_ids: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``token_ids`` at the cache end; return (logits [T or 1, V] fp32, hidden [T, h])."""
        if not self.caches:
            self.reset_cache()
        start = self.cache_length
        ids = torch.tensor([token_ids], dtype=torch.long)
        x = self.model.embed_tokens(ids)
        cos_sin = self.rotary.cos_sin(start, len(token_ids), x.dtype)
        for layer, cache in zip(self.model.layers, self.caches):
            x = layer(x, cos_sin, cache, start)
        hidden = self.model.norm(x)[0]
        logits = self.lm_head(hidden[-1:] if last_only else hidden)
        return logits.float(), hidden
