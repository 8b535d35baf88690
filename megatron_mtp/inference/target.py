"""The target (main) model: embedding, decoder layers with rollback-able KV caches, final norm, LM head.

``forward`` returns both the logits and the hidden state AFTER the final norm (``model.norm``):
that is ``h_0``, the input megatron-core's MTP depth 1 was trained on.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_mtp.inference.family import family_of
from megatron_mtp.inference.kv_cache import LatentKVCache
from megatron_mtp.inference.layers import HFConfig, RMSNorm


class _Body(nn.Module):
    """``model.*`` of the HF layout."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        family = family_of(config)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(family.decoder_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TargetModel(nn.Module):
    """Main model (any family of family.py) for batch-1 decoding with a rollback-able cache."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = family_of(config).rotary(config)
        self.caches: list[LatentKVCache] = []

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def reset_cache(self) -> None:
        family = family_of(self.config)
        self.caches = [family.new_cache(self.config, self.dtype) for _ in range(self.config.num_hidden_layers)]

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
