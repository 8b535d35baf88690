"""The target (main) model: embedding, decoder layers with rollback-able KV caches, final norm, LM head.

``forward`` returns both the logits and the hidden state AFTER the final norm (``model.norm``):
that is ``h_0``, the input megatron-core's MTP depth 1 was trained on. A drafter that reads other layers instead
names them (the ``Drafter``'s optional ``target_layers``; the decode loop calls ``hand_layers``): the hidden states
handed out are then those layers' outputs, concatenated, for every position the forward runs. A family whose
view gives an ``embedding_multiplier`` scales the embedding by it (in the embedding's dtype, as transformers
does), and one with ``final_logit_softcapping`` c returns c·tanh(logits / c) (Gemma 4).
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.inference.decoder import decoder_layer, rotary
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import HFConfig, RMSNorm, embed, softcap


class _Body(nn.Module):
    """``model.*`` of the HF layout."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(decoder_layer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class TargetModel(nn.Module):
    """Main model (any family of family.py) decoding a batch of sequences, one cache slot each, rollback
    per slot."""

    def __init__(self, config: HFConfig) -> None:
        super().__init__()
        self.config = config
        self.model = _Body(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        self.rotary = rotary(config)
        self.caches: list[KVCache] = []
        self.handed_layers: tuple[int, ...] | None = None

    def hand_layers(self, ids: tuple[int, ...] | list[int] | None) -> None:
        """Which hidden states ``forward_rows`` hands out: None, the final-normed output (``h_0``); else the outputs
        of these layers concatenated in this order, [N, len(ids)·h] (id 0: the embeddings entering the first layer;
        id i: layer i's output counted from 1, before the final norm)."""
        layers = self.config.num_hidden_layers
        if ids is not None and (not ids or any(not 0 <= i <= layers for i in ids)):
            raise UserError(f"a drafter asks for the target's layers {list(ids)}, but the target has layers "
                            f"0..{layers} (0: the embeddings); pair the drafter with the target it was trained on")
        self.handed_layers = tuple(ids) if ids is not None else None

    @property
    def dtype(self) -> torch.dtype:
        return self.lm_head.weight.dtype

    def reset_cache(self, slots: int = 1) -> None:
        self.caches = [layer.new_cache(self.dtype, slots) for layer in self.model.layers]

    def slot_length(self, slot: int) -> int:
        return self.caches[0].lengths[slot]

    def truncate_cache(self, length: int, slot: int = 0) -> None:
        for cache in self.caches:
            cache.truncate(length, slot)

    def forward(self, token_ids: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch 1: append ``token_ids`` at slot 0's end; return (logits [T or 1, V] fp32, hidden [T, h])."""
        if not self.caches:
            self.reset_cache()
        return self.forward_rows([0], [list(token_ids)], last_only)

    @torch.inference_mode()
    def forward_rows(
        self, slots: list[int], token_rows: list[list[int]], last_only: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append each row's tokens at its slot's end. Returns logits fp32 (every token packed [N, V], or
        each row's last [B, V] with ``last_only``) and the hidden states [N, h] (``hand_layers``: the named layers'
        outputs, [N, n·h]), packed in row order."""
        rows = Rows(slots, [self.caches[0].lengths[s] for s in slots], [len(r) for r in token_rows])
        ids = torch.tensor([t for row in token_rows for t in row], dtype=torch.long)
        x = embed(self.model.embed_tokens, ids, self.config)
        cos_sin = self.rotary.cos_sin(rows.token_positions, x.dtype) if self.rotary is not None else None
        handed = self.handed_layers
        kept = {0: x} if handed is not None and 0 in handed else {}
        for i, (layer, cache) in enumerate(zip(self.model.layers, self.caches), start=1):
            x = layer(x, cos_sin, cache, rows)
            if handed is not None and i in handed:
                kept[i] = x
        hidden = self.model.norm(x)
        logits = self.lm_head(hidden[rows.last_index] if last_only else hidden)
        out = torch.cat([kept[i] for i in handed], dim=-1) if handed is not None else hidden
        return softcap(logits.float(), self.config), out
