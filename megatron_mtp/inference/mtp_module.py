"""One exported MTP module (HF layer ``num_hidden_layers + i``), as megatron-core 0.16 runs it.

Forward at position t (megatron-core ``MultiTokenPredictionLayer``):
``x = eh_proj(cat([enorm(embed(token_{t+k})), hnorm(h_{k-1}(t))]))`` — embedding FIRST —
then one decoder layer (its own KV cache, rotary position t), then ``shared_head.norm``, then the
head. megatron-core hands the NEXT depth the output after ``shared_head.norm``
(``_postprocess`` applies ``final_layernorm`` before the block stacks the hidden states), so
:meth:`MTPParts.step_rows` returns both the normed and the pre-norm output.
The decoder layer is the family's: ``mtp_module(config, ...)`` builds an instance of the MTP parts over that
layer's class (decoder.py ``over_decoder_layer``), so a family with its own layer (Gemma 4) gets an MTP
module with its layer, its embedding multiplier and its soft-capped logits, as training computes them.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_mtp.inference.decoder import over_decoder_layer, rotary
from megatron_mtp.inference.target import embed, softcap
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import HFConfig, RMSNorm


class SharedHead(nn.Module):
    """``shared_head.norm`` and (when exported) ``shared_head.head``."""

    def __init__(self, config: HFConfig, with_head: bool) -> None:
        super().__init__()
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.head = nn.Linear(config.hidden_size, config.vocab_size, bias=False) if with_head else None


class MTPParts:
    """The MTP module's own parts and steps, mixed into the family's decoder-layer class."""

    def _init_parts(self, config: HFConfig, own_embedding: bool, own_head: bool) -> None:
        self.config = config
        self.enorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.hnorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.shared_head = SharedHead(config, own_head)
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size) if own_embedding else None
        self._fallback_embed: nn.Embedding | None = None
        self._fallback_head: nn.Linear | None = None
        self.rotary = rotary(config)
        self.cache: KVCache | None = None

    def share_with(self, embed: nn.Embedding, head: nn.Linear) -> None:
        """Use the main model's embedding/head where the export did not repeat them."""
        object.__setattr__(self, "_fallback_embed", embed)
        object.__setattr__(self, "_fallback_head", head)

    def reset_cache(self, slots: int = 1) -> None:
        self.cache = self.new_cache(self.eh_proj.weight.dtype, slots)

    def step(
        self, hidden_in: torch.Tensor, token_ids: list[int], start: int
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch 1 (slot 0): positions ``start..start+T-1``; (normed out [T,h], pre-norm out [T,h], last logits [V])."""
        if self.cache is None:
            self.reset_cache()
        post, pre, logits = self.step_rows(Rows([0], [start], [len(token_ids)]), hidden_in, token_ids)
        return post, pre, logits[0]

    @torch.inference_mode()
    def step_rows(
        self, rows: Rows, hidden_in: torch.Tensor, token_ids: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Packed rows: hidden [N,h] and tokens [N] in; (normed out [N,h], pre-norm out [N,h], each row's
        last logits [B,V])."""
        if self.cache is None:
            self.reset_cache()
        table = self.embed_tokens if self.embed_tokens is not None else self._fallback_embed
        head = self.shared_head.head if self.shared_head.head is not None else self._fallback_head
        assert table is not None and head is not None
        e = self.enorm(embed(table, torch.tensor(token_ids, dtype=torch.long), self.config))
        h = self.hnorm(hidden_in.to(e.dtype))
        x = self.eh_proj(torch.cat([e, h], dim=-1))
        cos_sin = self.rotary.cos_sin(rows.token_positions, x.dtype) if self.rotary is not None else None
        pre = self.layer_forward(x, cos_sin, self.cache, rows)
        post = self.shared_head.norm(pre)
        logits = softcap(head(post[rows.last_index]).float(), self.config)
        return post, pre, logits


def mtp_module(config: HFConfig, layer_index: int, own_embedding: bool, own_head: bool) -> MTPParts:
    """MTP module ``layer_index - num_hidden_layers`` of the family whose view ``config`` is (module note)."""
    return over_decoder_layer(MTPParts, config, layer_index, own_embedding=own_embedding, own_head=own_head)
