"""Gemma 4's assistant drafter (transformers' ``Gemma4AssistantForCausalLM``) drafting for a Gemma 4 target.

What it is. A small Gemma 4 text stack whose every layer shares the TARGET's keys and values: its attention
computes queries only and attends to the stored keys/values of the target's last layer of the same kind
(full or sliding attention; transformers' ``shared_kv_states``). ``pre_projection`` maps [target embedding
(sqrt(H)-scaled) of the last seen token ; a hidden state of the target's width] to its width,
``post_projection`` maps its final-normed output back; its logits come from its own tied embedding table
(``lm_head``), or from the centroid-masked table (``use_ordered_embeddings``).

Which token and position each step sees (transformers' ``SinglePositionMultiTokenCandidateGenerator``, and
this decoder's indices, draft.py): with ``seq[0..N-1]`` committed and ``seq[N-1]`` not yet fed to the target
(its cache holds positions 0..N-2, and its hidden state after the final norm h(t) is known for t <= N-2),
draft step 1 reads token ``seq[N-1]`` and h(N-2); step j > 1 reads the token drafted at step j-1 and step
j-1's ``post_projection`` output. Every step's queries sit at the one position N-1 (RoPE of the layer's
kind) and see the target's keys/values of positions 0..N-2: all of them in a full layer, the last
``sliding_window + 1`` of them in a sliding one (as transformers' mask has it). Nothing is cached: a
rollback only shortens the target hidden states kept per slot. Rows of a batch draft one after another
(one query each; a batched form would pad the rows' key/value spans).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.models.decoding.drafting import HiddenBuffer, PickFn
from megatron_mtp.models.decoding.layers import RMSNorm, embed
from megatron_mtp.models.gemma4.assistant.hf_config import AssistantConfig
from megatron_mtp.models.gemma4.decoder import Gemma4DecoderLayer, layer_kind
from megatron_mtp.models.gemma4.hf_view import FULL, Gemma4HFConfig
from megatron_mtp.models.gemma4.model_config import last_of_each_kind
from megatron_mtp.models.gemma4.rope import apply_rope, rope_cos_sin, rope_inv_freq


class QueryOnlyAttention(nn.Module):
    """``q_proj``, ``q_norm``, RoPE at the draft position, attention over the target's keys/values, ``o_proj``."""

    def __init__(self, config: Gemma4HFConfig, layer_index: int) -> None:
        super().__init__()
        self.kind = layer_kind(config, layer_index)
        full = self.kind == FULL
        self.head_dim = d = config.global_head_dim if full else config.head_dim
        self.heads = config.num_attention_heads
        # transformers' assistant mask (a bidirectional sliding window, flipped to look back from the end of the
        # target's keys) lets the draft query see the last sliding_window + 1 of them (measured against it: the
        # window of W gives 9e-5 of difference in the logits, W + 1 gives 2e-6)
        self.window = None if full else config.sliding_window + 1
        self.q_proj = nn.Linear(config.hidden_size, self.heads * d, bias=False)
        self.q_norm = RMSNorm(d, config.rms_norm_eps)
        self.o_proj = nn.Linear(self.heads * d, config.hidden_size, bias=False)
        base, share = ((config.global_rope_theta, config.global_partial_rotary_factor) if full
                       else (config.rope_theta, 1.0))
        self.inv_freq = rope_inv_freq(d, base, share, device="cpu")

    def forward(self, x: torch.Tensor, position: int, kv: dict[str, tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """x [1, h]; kv: kind -> (keys, values) [S, G, D] of the target; returns [1, h]."""
        q = self.q_norm(self.q_proj(x).view(1, self.heads, self.head_dim))
        cos, sin = rope_cos_sin(self.inv_freq, torch.tensor([position]), q.dtype)
        q = apply_rope(q, cos[:, None], sin[:, None])
        keys, values = kv[self.kind]
        if self.window is not None:
            keys, values = keys[-self.window:], values[-self.window:]
        out = F.scaled_dot_product_attention(q.transpose(0, 1)[None], keys.transpose(0, 1)[None],
                                             values.transpose(0, 1)[None], scale=1.0,
                                             enable_gqa=self.heads != keys.shape[1])
        return self.o_proj(out[0].transpose(0, 1).reshape(1, -1))


class AssistantLayer(Gemma4DecoderLayer):
    """A Gemma 4 decoder layer (sandwich norms, GELU-tanh MLP, ``layer_scalar``, no experts) with query-only
    attention."""

    def __init__(self, config: Gemma4HFConfig, layer_index: int) -> None:
        super().__init__(config, layer_index, attention=QueryOnlyAttention)

    def forward(self, x: torch.Tensor, position: int, kv) -> torch.Tensor:
        return self.sandwich(x, lambda normed: self.self_attn(normed, position, kv))


class _Stack(nn.Module):
    """``model.*``: the embedding table (the tied output), the layers and the final norm."""

    def __init__(self, config: Gemma4HFConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(AssistantLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class MaskedEmbedding(nn.Module):
    """``masked_embedding``: logits only over the tokens of the top centroids, every other one below their minimum."""

    def __init__(self, config: AssistantConfig) -> None:
        super().__init__()
        self.top_k, self.num_centroids = config.centroid_intermediate_top_k, config.num_centroids
        self.per_centroid = config.text.vocab_size // config.num_centroids
        self.centroids = nn.Linear(config.text.hidden_size, config.num_centroids, bias=False)
        self.register_buffer("token_ordering", torch.zeros(config.text.vocab_size, dtype=torch.long))

    def forward(self, hidden: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
        chosen = torch.topk(self.centroids(hidden), self.top_k, dim=-1).indices  # [1, k]
        tokens = self.token_ordering.long().view(self.num_centroids, self.per_centroid)[chosen].reshape(-1)
        selected = hidden @ table[tokens].t()  # [1, k * per_centroid]
        out = torch.full((1, table.shape[0]), selected.min().item() - 1.0, dtype=hidden.dtype)
        return out.scatter_(1, tokens[None], selected)


class AssistantModel(nn.Module):
    """``Gemma4AssistantForCausalLM``'s weights under its names; ``step`` is one draft step (module note)."""

    def __init__(self, config: AssistantConfig) -> None:
        super().__init__()
        self.config = config
        text = config.text
        self.model = _Stack(text)
        self.pre_projection = nn.Linear(2 * config.backbone_hidden_size, text.hidden_size, bias=False)
        self.post_projection = nn.Linear(text.hidden_size, config.backbone_hidden_size, bias=False)
        self.masked_embedding = MaskedEmbedding(config) if config.use_ordered_embeddings else None

    @torch.inference_mode()
    def step(self, embedding: torch.Tensor, hidden: torch.Tensor, position: int,
             kv) -> tuple[torch.Tensor, torch.Tensor]:
        """(logits [V] fp32, the next step's hidden [1, backbone]) from the target embedding and a hidden state."""
        x = self.pre_projection(torch.cat([embedding, hidden.to(embedding.dtype)], dim=-1))
        for layer in self.model.layers:
            x = layer(x, position, kv)
        x = self.model.norm(x)
        table = self.model.embed_tokens.weight
        logits = self.masked_embedding(x, table) if self.masked_embedding is not None else x @ table.t()
        return logits[0].float(), self.post_projection(x)


def assistant_model(raw: dict[str, Any], path: Path, target) -> AssistantModel:
    """The model of the transformers-format assistant directory ``path`` (its config.json ``raw``) on the meta
    device, checked against the target it drafts for (the family's ``assistant_decoder``; inference/generate.py
    loads its weights)."""
    config = AssistantConfig.read(raw, str(path / "config.json"))
    tc = target.config
    if getattr(tc, "model_type", None) != "gemma4_text":
        raise UserError(f"a Gemma 4 assistant drafts for a Gemma 4 target, and this model is "
                        f"{getattr(tc, 'model_type', None)!r}; draft with its MTP modules instead")
    if config.backbone_hidden_size != tc.hidden_size or config.text.vocab_size != tc.vocab_size:
        raise UserError(f"the assistant '{path}' drafts for a model of hidden size {config.backbone_hidden_size} and "
                        f"vocabulary {config.text.vocab_size}; this target has {tc.hidden_size} and {tc.vocab_size}")
    for kind in set(config.text.layer_types):
        ours = (config.text.global_head_dim if kind == FULL else config.text.head_dim)
        theirs = (tc.global_head_dim if kind == FULL else tc.head_dim)
        if ours != theirs or kind not in tc.layer_types:
            raise UserError(f"the assistant's {kind} layers read head width {ours}, and the target's {kind} layers "
                            f"store {theirs if kind in tc.layer_types else 'none'}; pass the target's own assistant")
    with torch.device("meta"):
        return AssistantModel(config)


def stored_layers(target) -> dict[str, int]:
    """The target layer whose keys/values the assistant reads, per kind: the last of that kind."""
    return last_of_each_kind(target.config.layer_types)


class AssistantDrafter:
    """A ``Drafter`` (inference/draft.py) drafting with a Gemma 4 assistant over the target's own caches (module
    note)."""

    def __init__(self, assistant: AssistantModel, target) -> None:
        self.assistant, self.target = assistant, target
        self.layers = stored_layers(target)
        self.reset()

    depth = 1

    def reset(self, slots: int = 1) -> None:
        self._hidden = [HiddenBuffer(self.target.config.hidden_size, self.target.dtype) for _ in range(slots)]

    def clear_slot(self, slot: int) -> None:
        self._hidden[slot].truncate(0)

    def observe_rows(self, slots: list[int], hiddens: list[torch.Tensor], starts: list[int]) -> None:
        for slot, hidden, start in zip(slots, hiddens, starts):
            self._hidden[slot].truncate(start)
            self._hidden[slot].write(start, hidden)

    def _kv(self, slot: int, length: int) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        out = {}
        for kind, index in self.layers.items():
            layer, cache = self.target.model.layers[index], self.target.caches[index]
            attn = layer.self_attn
            keys = cache.buffers["k"][slot, :length].view(length, attn.kv_heads, attn.head_dim)
            values = cache.buffers["v"][slot, :length].view(length, attn.kv_heads, attn.head_dim)
            out[kind] = (keys, values)
        return out

    @torch.inference_mode()
    def propose_rows(self, slots: list[int], seqs: list[list[int]], ks: list[int], picks: list[PickFn]
                     ) -> tuple[list[list[int]], list[list[Optional[torch.Tensor]]]]:
        drafts: list[list[int]] = []
        dists: list[list[Optional[torch.Tensor]]] = []
        for slot, seq, k, pick in zip(slots, seqs, ks, picks):
            n = len(seq)
            kv = self._kv(slot, n - 1)
            hidden = self._hidden[slot].read(n - 2, n - 1)
            token, row, row_dists = seq[-1], [], []
            for _ in range(k):
                e = embed(self.target.model.embed_tokens, torch.tensor([token]), self.target.config)
                logits, hidden = self.assistant.step(e, hidden, n - 1, kv)
                token, dist = pick(logits)
                row.append(token)
                row_dists.append(dist)
            drafts.append(row)
            dists.append(row_dists)
        return drafts, dists

    def rollback_rows(self, slots: list[int], committed: list[int]) -> None:
        for slot, n in zip(slots, committed):
            self._hidden[slot].truncate(n - 1)
