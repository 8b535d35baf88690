"""Drafting with parallel MTP heads (``mtp.style: parallel``; export format: mtp_styles/parallel/hf_format.py).

Head k (1-based) is a decoder layer with its own KV cache over the TARGET's positions, fed the target's
hidden state ``h_0(t)`` after ``model.norm``, then its own norm (``heads.{k-1}.norm``) and the target's
``lm_head``; at position t it predicts token t+1+k (training: mtp_styles/parallel/model.py).

One round (``seq[N-1]`` pending, ``h_0`` known for positions ``<= N-2``, see draft.py): draft d_j is head j at
position ``N-2``, predicting ``seq[N-1+j]`` (the target itself predicts the pending ``seq[N-1]`` there).
No draft depends on another, so all K <= n drafts come from one draft forward: each head catches up
over the positions it has not seen (the a+1 accepted ones of the last round) and reads its last row.
Sampled drafts are independent draws from each head's q_j; since q_j does not depend on d_1..d_{j-1},
it is a valid proposal for position j given any accepted prefix, so Leviathan verification stays lossless.

Rollback is trivial: a head's cache entry at position t depends only on ``h_0(0..t)``, which is final
for every t the heads have seen (``t <= N-2 < N'-1``), so entries are never invalidated; only the
target-hidden buffer is cut to the target cache.

Batches (draft.py's note): per slot the same; head j runs one forward over the sequences with K >= j.
"""

from __future__ import annotations

import torch
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import HFDir
from megatron_mtp.inference.decoder import over_decoder_layer, rotary
from megatron_mtp.inference.model_dir import ExportDirs, _load_into, decodable_config
from megatron_mtp.inference.target import TargetModel, softcap
from megatron_mtp.models.decoding.drafting import HiddenBuffer, PickFn
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.layers import HFConfig, RMSNorm
from megatron_mtp.models.tensor_table import hf_head_prefix
from megatron_mtp.mtp_styles.parallel.hf_format import is_heads_config, read_heads_config


class HeadParts:
    """A head's own parts and steps, mixed into the family's decoder-layer class (``parallel_head``)."""

    def _init_parts(self, config: HFConfig) -> None:
        self.config = config
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.rotary = rotary(config)  # None where each layer kind applies its own (Gemma 4)
        self.cache: KVCache | None = None

    def reset_cache(self, slots: int = 1) -> None:
        self.cache = self.new_cache(self.norm.weight.dtype, slots)

    def step(self, hidden_in: torch.Tensor, start: int) -> torch.Tensor:
        """Batch 1 (slot 0): positions ``start..start+T-1`` from target hidden states [T, h]; the normed output."""
        if self.cache is None:
            self.reset_cache()
        return self.step_rows(Rows([0], [start], [hidden_in.shape[0]]), hidden_in)

    @torch.inference_mode()
    def step_rows(self, rows: Rows, hidden_in: torch.Tensor) -> torch.Tensor:
        """Packed target hidden states [N, h] of ``rows``; the normed output [N, h]."""
        x = hidden_in.to(self.norm.weight.dtype)
        cos_sin = self.rotary.cos_sin(rows.token_positions, x.dtype) if self.rotary is not None else None
        return self.norm(self.layer_forward(x, cos_sin, self.cache, rows))


def parallel_head(config: HFConfig) -> HeadParts:
    """One head of the family whose view ``config`` is: its decoder layer (HF names of ``model.layers.N``) shaped
    as an MTP layer at index ``num_hidden_layers`` (training builds each head as the MTP layer: Gemma 4's is
    full attention), plus ``norm`` (decoder.py ``over_decoder_layer``)."""
    return over_decoder_layer(HeadParts, config, config.num_hidden_layers)


class ParallelHeadsDrafter:
    """Drafts K <= n tokens per round with n parallel heads (the ``Drafter`` protocol of draft.py)."""

    def __init__(self, heads: list[HeadParts], lm_head: nn.Linear) -> None:
        if not heads:
            raise ValueError("ParallelHeadsDrafter needs at least one head")
        self.heads = heads
        self.lm_head = lm_head
        self.reset()

    @property
    def depth(self) -> int:
        return len(self.heads)

    @property
    def max_draft(self) -> int:
        """Each head drafts one position: K is at most the number of heads."""
        return len(self.heads)

    def reset(self, slots: int = 1) -> None:
        for head in self.heads:
            head.reset_cache(slots)
        self._hidden = [HiddenBuffer(self.heads[0].config.hidden_size, self.heads[0].norm.weight.dtype)
                        for _ in range(slots)]

    def clear_slot(self, slot: int) -> None:
        self._hidden[slot].truncate(0)
        for head in self.heads:
            assert head.cache is not None
            head.cache.truncate(0, slot)

    def observe_rows(self, slots: list[int], hiddens: list[torch.Tensor], starts: list[int]) -> None:
        for slot, hidden, start in zip(slots, hiddens, starts):
            self._hidden[slot].truncate(start)
            self._hidden[slot].write(start, hidden)

    def logits(self, head: HeadParts, normed: torch.Tensor) -> torch.Tensor:
        """A head's logits [N, V] (float32) from its normed outputs [N, h]: the target's ``lm_head``, soft-capped
        where the family caps its logits (as training's output layer does)."""
        return softcap(self.lm_head(normed).float(), head.config)

    @torch.inference_mode()
    def propose_rows(self, slots: list[int], seqs: list[list[int]], ks: list[int], picks: list[PickFn]
                     ) -> tuple[list[list[int]], list[list[torch.Tensor | None]]]:
        if max(ks, default=0) > self.max_draft:
            raise UserError(f"{max(ks)} draft tokens asked from {self.max_draft} parallel MTP heads; each head drafts "
                            f"one position, so use --speculative {self.max_draft} or fewer")
        drafts: list[list[int]] = [[] for _ in slots]
        dists: list[list[torch.Tensor | None]] = [[] for _ in slots]
        for j, head in enumerate(self.heads[: max(ks, default=0)], start=1):
            assert head.cache is not None
            live = [i for i, k in enumerate(ks) if k >= j]
            starts = [head.cache.lengths[slots[i]] for i in live]
            ends = [len(seqs[i]) - 1 for i in live]  # through the anchor, the last position with a target hidden state
            hidden = torch.cat([self._hidden[slots[i]].read(start, end) for i, start, end in zip(live, starts, ends)])
            rows = Rows([slots[i] for i in live], starts, [e - s for s, e in zip(starts, ends)])
            logits = self.logits(head, head.step_rows(rows, hidden)[rows.last_index])
            for r, i in enumerate(live):
                token, dist = picks[i](logits[r])
                drafts[i].append(token)
                dists[i].append(dist)
        return drafts, dists

    def rollback_rows(self, slots: list[int], committed: list[int]) -> None:
        for slot, n in zip(slots, committed):
            self._hidden[slot].truncate(n - 1)
            for head in self.heads:
                assert head.cache is not None
                head.cache.truncate(min(head.cache.lengths[slot], n - 1), slot)

    def cache_lengths(self, slot: int = 0) -> list[int]:
        return [head.cache.lengths[slot] if head.cache is not None else 0 for head in self.heads]


def load_parallel_heads(dirs: ExportDirs, target: TargetModel, dtype: torch.dtype) -> ParallelHeadsDrafter | None:
    """The drafter of an export whose ``mtp/`` holds parallel heads; None for any other export."""
    if dirs.mtp_dir is None:
        return None
    weights = HFDir(dirs.mtp_dir)
    if not is_heads_config(weights.config):
        return None
    where = weights.path / "config.json"
    heads_cfg = read_heads_config(weights.config, str(where), HFDir(dirs.main_dir).config)
    config = decodable_config(dict(heads_cfg.main_config), where)
    heads = []
    for i in range(heads_cfg.num_heads):
        prefix = hf_head_prefix(i)
        if prefix + "norm.weight" not in weights:
            raise UserError(f"{weights.path} lacks {prefix}norm.weight for parallel head {i + 1}; re-export the "
                            "MTP part.")
        with torch.device("meta"):
            head = parallel_head(config)
        _load_into(head, weights, prefix, dtype, config.n_routed_experts)
        head.eval()
        heads.append(head)
    return ParallelHeadsDrafter(heads, target.lm_head)
