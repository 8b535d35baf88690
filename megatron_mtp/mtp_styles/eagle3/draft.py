"""Drafting with an EAGLE-3 drafter in speculators' format (hf.py) beside its target: the model in plain torch, as
speculators 0.9.0's ``Eagle3DraftModel`` computes it, with a rollback-able KV cache per layer, and the decoder's
``Drafter`` over it (inference/draft.py's protocol).

Design note (which state goes where). The target hands the drafter, for every position it runs, its outputs at the
layers ``eagle_aux_hidden_state_layer_ids`` (inference/target.py ``hand_layers``: id 0 the embeddings, id i layer
i's output before the final norm, what training hooks, model.py). With ``seq[0..N-1]`` committed and ``seq[N-1]``
pending (the target holds positions ``0..N-2``), the drafter's cache entry c is "anchor" c: the input
``[E(seq[c+1]) ; fc(aux(c))]`` at rotary position c + 1 (speculators pairs the target's state at t with the token
t + 1, positions from 1: its ``shift_batch``). Entries of anchors ``0..N-2`` are final: the token and the state
they read are committed. A round (draft step j = 1..K, predicting ``seq[N-1+j]``):
- j = 1: one forward catches the cache up over the anchors it lacks (``ctx .. N-2``: the accepted tokens of the
  last round) and drafts from the last one, anchor N-2 (training's step 0);
- j > 1: one more entry, ``[E(d_{j-1}) ; h_{j-1}]`` at rotary position N-2+j, where ``h_{j-1}`` is step j-1's
  layer output (after the final norm with ``norm_output``): training's step j-1 at anchor N-2, which sees the
  context's entries and the earlier steps' at its own anchor, exactly what a causal cache holds.
The logits over the draft vocabulary go to target ids (``d2t``: target id = draft index + d2t); every other target
id gets -inf, so the run's own pick (argmax, or temperature → top-k → top-p and a draw) drafts a target id and its
q is the draft distribution placed at the target ids, zero elsewhere: the acceptance rule (inference/verify.py)
keeps the target's distribution. Rollback cuts each slot's cache to its context (the chained entries of the round
are dropped; the accepted tokens' anchors are caught up at the next round from the aux states the target handed).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.models.decoding.drafting import HiddenBuffer, PickFn
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import GatedMLP, RMSNorm, Rotary, rotate_half
from megatron_mtp.mtp_styles.eagle3 import hf
from megatron_mtp.mtp_styles.eagle3.shape import DrafterShape


class _Attention(nn.Module):
    """Llama attention (no biases, rotate-half RoPE over the whole head) with a KV cache; ``q/k/v_proj`` read
    ``width`` (2 × hidden in the first layer)."""

    def __init__(self, shape: DrafterShape, width: int) -> None:
        super().__init__()
        self.heads, self.groups, self.head_dim = shape.heads, shape.groups, shape.head_dim
        self.q_proj = nn.Linear(width, shape.heads * shape.head_dim, bias=False)
        self.k_proj = nn.Linear(width, shape.groups * shape.head_dim, bias=False)
        self.v_proj = nn.Linear(width, shape.groups * shape.head_dim, bias=False)
        self.o_proj = nn.Linear(shape.heads * shape.head_dim, shape.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos_sin: tuple[torch.Tensor, torch.Tensor], cache: KVCache,
                rows: Rows) -> torch.Tensor:
        n = x.shape[0]
        cos, sin = (t.unsqueeze(1) for t in cos_sin)
        q = self.q_proj(x).view(n, self.heads, self.head_dim)
        k = self.k_proj(x).view(n, self.groups, self.head_dim)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        kept = cache.write(rows, {"k": rows.unpack(k.reshape(n, -1)), "v": rows.unpack(self.v_proj(x))})
        b, s = kept["k"].shape[:2]
        key = kept["k"].view(b, s, self.groups, self.head_dim).transpose(1, 2)
        value = kept["v"].view(b, s, self.groups, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(rows.unpack(q).transpose(1, 2), key, value, attn_mask=rows.mask,
                                             scale=self.head_dim ** -0.5, enable_gqa=self.heads != self.groups)
        return self.o_proj(rows.pack(out.transpose(1, 2)).reshape(n, -1))


class _Layer(nn.Module):
    """A Llama decoder layer; the first reads ``[embedding ; hidden]``: ``input_layernorm`` on the embedding half,
    ``hidden_norm`` on the hidden half, the residual the hidden half (normed with ``norm_before_residual``)."""

    def __init__(self, shape: DrafterShape, first: bool) -> None:
        super().__init__()
        self.first, self.norm_before_residual = first, shape.norm_before_residual
        self.input_layernorm = RMSNorm(shape.hidden, shape.eps)
        if first:
            self.hidden_norm = RMSNorm(shape.hidden, shape.eps)
        self.self_attn = _Attention(shape, 2 * shape.hidden if first else shape.hidden)
        self.post_attention_layernorm = RMSNorm(shape.hidden, shape.eps)
        self.mlp = GatedMLP(shape.hidden, shape.ffn)

    def new_cache(self, dtype: torch.dtype, slots: int) -> KVCache:
        width = self.self_attn.groups * self.self_attn.head_dim
        return KVCache({"k": width, "v": width}, dtype, slots)

    def forward(self, x: torch.Tensor, cos_sin, cache: KVCache, rows: Rows) -> torch.Tensor:
        if self.first:
            embedding, hidden = x.chunk(2, dim=-1)
            normed = self.hidden_norm(hidden)
            residual = normed if self.norm_before_residual else hidden
            x = torch.cat([self.input_layernorm(embedding), normed], dim=-1)
        else:
            residual, x = x, self.input_layernorm(x)
        x = residual + self.self_attn(x, cos_sin, cache, rows)
        return x + self.mlp(self.post_attention_layernorm(x))


class Eagle3Model(nn.Module):
    """``fc``, ``layers``, ``norm``, ``lm_head``, ``d2t``/``t2d``: speculators' tensor names (module note). The token
    embeddings are the target's table, handed to ``step``."""

    def __init__(self, shape: DrafterShape) -> None:
        super().__init__()
        self.shape = shape
        self.fc = nn.Linear(len(shape.aux_layers) * shape.hidden, shape.hidden, bias=False)
        self.layers = nn.ModuleList(_Layer(shape, i == 0) for i in range(shape.num_layers))
        self.norm = RMSNorm(shape.hidden, shape.eps)
        self.lm_head = nn.Linear(shape.hidden, shape.draft_vocab, bias=False)
        self.register_buffer("d2t", torch.zeros(shape.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.ones(shape.vocab, dtype=torch.bool))
        self.rotary = Rotary(shape.head_dim, shape.rope_theta)
        self.caches: list[KVCache] = []

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    @property
    def draft_ids(self) -> torch.Tensor:
        """[draft vocab] the target id of each draft index."""
        return self.d2t + torch.arange(self.d2t.numel())

    def reset_cache(self, slots: int = 1) -> None:
        self.caches = [layer.new_cache(self.dtype, slots) for layer in self.layers]

    def truncate(self, length: int, slot: int) -> None:
        for cache in self.caches:
            cache.truncate(min(length, cache.lengths[slot]), slot)

    def step(self, rows: Rows, embeddings: torch.Tensor, hidden: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[embeddings ; hidden]`` (packed [n, h] each) at each row's cache end, rotary position = cache
        index + 1. Returns (the hidden state the next step reads [n, h], the draft-vocabulary logits fp32 [n, N])."""
        x = torch.cat([embeddings.to(self.dtype), hidden], dim=-1)
        cos_sin = self.rotary.cos_sin(rows.token_positions + 1, self.dtype)
        for layer, cache in zip(self.layers, self.caches):
            x = layer(x, cos_sin, cache, rows)
        normed = self.norm(x)
        return (normed if self.shape.norm_output else x), self.lm_head(normed).float()


class Eagle3Drafter:
    """The decoder's ``Drafter`` over an ``Eagle3Model`` (module note): per slot its aux states by position and the
    number of final cache entries (its context)."""

    def __init__(self, model: Eagle3Model, embedding: nn.Embedding, vocab_size: int) -> None:
        self.model, self.embedding, self.vocab_size = model, embedding, vocab_size
        self.target_layers = tuple(model.shape.aux_layers)  # what the target hands observe_rows (inference/target.py)
        self._draft_ids = model.draft_ids  # the target id of each draft index
        self.reset()

    def reset(self, slots: int = 1) -> None:
        width = len(self.target_layers) * self.model.shape.hidden
        self.model.reset_cache(slots)
        self._aux = [HiddenBuffer(width, self.model.dtype) for _ in range(slots)]
        self._context = [0] * slots

    def clear_slot(self, slot: int) -> None:
        self._aux[slot].truncate(0)
        self._context[slot] = 0
        self.model.truncate(0, slot)

    def observe_rows(self, slots: list[int], hiddens: list[torch.Tensor], starts: list[int]) -> None:
        """Record the target's aux states (the layers ``target_layers`` names, concatenated) from each ``start``."""
        for slot, hidden, start in zip(slots, hiddens, starts):
            self._aux[slot].truncate(start)
            self._aux[slot].write(start, hidden.to(self.model.dtype))

    def _target_logits(self, logits: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary logits [N] -> target-vocabulary logits [V], -inf where the drafter has no token."""
        out = torch.full((self.vocab_size,), float("-inf"), dtype=logits.dtype)
        out[self._draft_ids] = logits
        return out

    @torch.inference_mode()
    def propose_rows(self, slots: list[int], seqs: list[list[int]], ks: list[int], picks: list[PickFn]
                     ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        drafts: list[list[int]] = [[] for _ in slots]
        dists: list[list[torch.Tensor | None]] = [[] for _ in slots]
        live = [i for i, k in enumerate(ks) if k >= 1]
        if not live:
            return drafts, dists
        starts, counts, aux, tokens = [], [], [], []
        for i in live:  # catch up over the anchors not yet in the cache, ending at the last one, N-2
            slot, anchor = slots[i], len(seqs[i]) - 2
            start = self._context[slot]
            self.model.truncate(start, slot)
            aux.append(self._aux[slot].read(start, anchor + 1))
            tokens += seqs[i][start + 1: anchor + 2]
            starts.append(start)
            counts.append(anchor + 1 - start)
            self._context[slot] = anchor + 1
        rows = Rows([slots[i] for i in live], starts, counts)
        hidden, logits = self.model.step(rows, self._embed(tokens), self.model.fc(torch.cat(aux)))
        hidden, logits = hidden[rows.last_index], logits[rows.last_index]
        for j in range(1, max(ks) + 1):
            if j > 1:  # one more entry per row still drafting: its last draft and its own previous output
                keep = [r for r, i in enumerate(live) if ks[i] >= j]
                live = [live[r] for r in keep]
                rows = Rows([slots[i] for i in live], [len(seqs[i]) - 3 + j for i in live], [1] * len(live))
                hidden, logits = self.model.step(rows, self._embed([drafts[i][-1] for i in live]), hidden[keep])
            for r, i in enumerate(live):
                token, dist = picks[i](self._target_logits(logits[r]))
                drafts[i].append(token)
                dists[i].append(dist)
        return drafts, dists

    def _embed(self, tokens: list[int]) -> torch.Tensor:
        return self.embedding(torch.tensor(tokens, dtype=torch.long))

    def rollback_rows(self, slots: list[int], committed: list[int]) -> None:
        """Keep each slot's context entries (final) and the aux states of its committed positions but the pending
        one's."""
        for slot, n in zip(slots, committed):
            self._aux[slot].truncate(n - 1)
            self._context[slot] = min(self._context[slot], n - 1)
            self.model.truncate(self._context[slot], slot)

    def cache_lengths(self, slot: int = 0) -> list[int]:
        return [cache.lengths[slot] for cache in self.model.caches]


def load_eagle3(path: Path, target, dtype: torch.dtype) -> Eagle3Drafter:
    """The speculators EAGLE-3 drafter in ``path`` drafting for ``target`` (inference/target.py): its config checked
    (hf.shape_of: one sentence for what is not built), its shape against the target's, its tensors loaded."""
    config, tensors = hf.read_dir(path)
    shape = hf.shape_of(config, str(path / "config.json"))
    t = target.config
    if shape.hidden != t.hidden_size or max(shape.aux_layers) > t.num_hidden_layers or shape.vocab > t.vocab_size:
        raise UserError(f"{path} is an EAGLE-3 drafter of hidden size {shape.hidden}, vocabulary {shape.vocab} and aux "
                        f"layers {list(shape.aux_layers)}, which does not fit the target beside it (hidden size "
                        f"{t.hidden_size}, vocabulary {t.vocab_size}, {t.num_hidden_layers} layers); pair it with "
                        "the target it was trained on")
    embedding = target.model.embed_tokens
    theirs = tensors.get(hf.EMBEDDING)
    if theirs is not None and not torch.equal(theirs, embedding.weight[:shape.vocab].to(theirs.dtype)):
        raise UserError(f"{path}: its embed_tokens.weight is not the target's embedding table, which the drafter "
                        "reads; pair it with the target it was trained on")
    if shape.restricted and ("d2t" not in tensors or "t2d" not in tensors):
        raise UserError(f"{path}: a draft vocabulary of {shape.draft_vocab} tokens needs its d2t and t2d tables, "
                        "which model.safetensors lacks; re-export the drafter")
    with torch.device("meta"):
        model = Eagle3Model(shape)
    state = {}
    for key, value in model.state_dict().items():
        if key not in tensors:
            if key in ("d2t", "t2d"):  # the whole vocabulary: identity tables
                state[key] = torch.zeros_like(value, device="cpu") if key == "d2t" else torch.ones_like(
                    value, device="cpu")
                continue
            raise UserError(f"{path} lacks the tensor {key} an EAGLE-3 drafter of its config.json needs; re-export "
                            "the drafter")
        if tuple(tensors[key].shape) != tuple(value.shape):
            raise UserError(f"{path}: {key} has shape {list(tensors[key].shape)}, its config.json implies "
                            f"{list(value.shape)}; re-export the drafter")
        state[key] = tensors[key].to(dtype) if value.is_floating_point() else tensors[key]
    model.load_state_dict(state, strict=True, assign=True)
    return Eagle3Drafter(model.eval(), embedding, t.vocab_size)
