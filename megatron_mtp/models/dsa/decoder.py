"""The decoder's layer for the DSA families (DeepSeek-V3.2, GLM-5): DeepSeek-V3's MLA decoder layer
(models/decoding/mla.py) whose attention reads, per new token, only the ``index_topk`` earlier tokens its
lightning indexer scores best. Math as transformers 5.25's ``modeling_deepseek_v32`` / ``modeling_glm_moe_dsa``,
but for the q/kv latent norms' eps: ``rms_norm_eps``, as megatron-core trains them (transformers: 1e-6 always).

Design note.
- The indexer (``Indexer``, HF names ``self_attn.indexer.{wq_b,wk,k_norm,weights_proj}``): a query of
  ``index_n_heads`` heads of ``index_head_dim`` from the attention's normed query latent (``wq_b``), one key per
  token (``k_norm(wk(x))``, a LayerNorm with bias, eps 1e-6); the first ``qk_rope_head_dim`` dimensions of both
  rotated by the model's RoPE table (DeepSeek-V3.2: rotate-half; GLM-5: interleaved pairs, the family's
  ``INDEX_INTERLEAVE``). Score of key j for query i: sum over heads h of
  ``w_h(i) * relu(q_h(i) . k(j) * index_head_dim**-0.5)`` with ``w = weights_proj(x) * index_n_heads**-0.5``
  (fp32, as transformers keeps ``weights_proj`` in fp32).
- Its cache: the indexer keys are a third named buffer, ``index_k``, of the layer's MLA cache (kv_cache.py), so
  they are written, padded, read and rolled back (``truncate``) with the latent and rotary key, per slot.
- Selection: per new token, the ``index_topk`` best keys among those it may see (causal, within its row's
  span; fewer visible: all of them; equal scores: the earlier key), as a boolean mask ANDed with ``rows.mask``
  and handed to MLA's attention. A forward whose longest span is at most ``index_topk`` selects everything,
  so it skips the scoring; a long prefill scores its queries in blocks (``Indexer.SCORE_ELEMENTS``).
- IndexShare (GLM-5's ``indexer_types``): a "shared" layer has no indexer (no tensors, no ``index_k``) and reuses
  the mask of the last full layer of the same forward, which that layer leaves in ``rows.carried``.
- The MTP layers run their own indexer where megatron-core builds one (depth d: its layer number d + 1 under
  ``index_topk_freq``/``index_skip_topk_offset``, as the tensor table exports it); a depth that would reuse an
  earlier layer's top-k is refused in one sentence (nothing in its own forward to reuse).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from megatron_mtp.errors import UserError
from megatron_mtp.models.decoding.kv_cache import KVCache, Rows
from megatron_mtp.models.decoding.mla import MLADecoderLayer, MLAttention, apply_rope
from megatron_mtp.models.dsa.hf_view import DSAHFConfig
from megatron_mtp.models.dsa.model_config import runs_own_indexer

_CARRIED = "dsa_selection"
"""The key of the last full layer's selection in ``rows.carried``."""


class Indexer(nn.Module):
    """The lightning indexer of one layer (module note)."""

    def __init__(self, config: DSAHFConfig, interleave: bool) -> None:
        super().__init__()
        self.heads, self.head_dim, self.rope = config.index_n_heads, config.index_head_dim, config.qk_rope_head_dim
        self.topk, self.interleave = config.index_topk, interleave
        self.wq_b = nn.Linear(config.q_lora_rank, self.heads * self.head_dim, bias=False)
        self.wk = nn.Linear(config.hidden_size, self.head_dim, bias=False)
        self.k_norm = nn.LayerNorm(self.head_dim, eps=1e-6)
        self.weights_proj = nn.Linear(config.hidden_size, self.heads, bias=False)

    def project(self, x: torch.Tensor, q_latent: torch.Tensor,
                cos_sin: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        """(queries [N, heads, D], keys [N, D]) of the packed tokens, their first ``rope`` dims rotated."""
        n = x.shape[0]
        q = self.wq_b(q_latent).view(n, self.heads, self.head_dim)
        k = self.k_norm(self.wk(x)).unsqueeze(1)  # [N, 1, D]
        pass_dim = self.head_dim - self.rope
        q_rot, q_pass = torch.split(q, [self.rope, pass_dim], dim=-1)
        k_rot, k_pass = torch.split(k, [self.rope, pass_dim], dim=-1)
        q_rot, k_rot = apply_rope(q_rot, k_rot, cos_sin[0], cos_sin[1], self.interleave)
        return torch.cat([q_rot, q_pass], dim=-1), torch.cat([k_rot, k_pass], dim=-1)[:, 0]

    SCORE_ELEMENTS = 1 << 24
    """The most scores ([rows, queries, heads, keys]) held at once: a long prefill scores its queries in blocks."""

    def select(self, x: torch.Tensor, queries: torch.Tensor, keys: torch.Tensor, rows: Rows) -> torch.Tensor | None:
        """The keys each new token reads, [B, 1, T, S] (``rows.mask`` where that is every visible key): its
        ``topk`` best-scoring visible ones. ``queries`` [N, heads, D] packed, ``keys`` [B, S, D] every row's."""
        s = keys.shape[1]
        if s <= self.topk:
            return rows.mask
        q = rows.unpack(queries).float()  # [B, T, heads, D]
        weights = F.linear(x.to(self.weights_proj.weight.dtype), self.weights_proj.weight).float()
        weights = rows.unpack(weights * self.heads**-0.5)  # [B, T, heads]
        visible = rows.mask if rows.mask is not None else torch.ones(1, 1, 1, s, dtype=torch.bool)
        b, t = q.shape[:2]
        step = max(1, self.SCORE_ELEMENTS // (b * self.heads * s))
        keys_t = keys.float().transpose(-1, -2).unsqueeze(1)  # [B, 1, D, S]
        chosen = []
        for i in range(0, t, step):
            scores = F.relu(torch.matmul(q[:, i : i + step], keys_t) * self.head_dim**-0.5)  # [B, t', heads, S]
            index = torch.matmul(weights[:, i : i + step].unsqueeze(-2), scores).squeeze(-2)  # [B, t', S]
            index = index.masked_fill(~visible[:, 0, i : i + step], float("-inf"))
            # a stable sort, not topk: equal scores (every head's ReLU 0) go to the earlier key whatever the
            # forward's shape, so a verify forward selects as the single steps it replaces (greedy spec == plain)
            chosen.append(index.sort(dim=-1, descending=True, stable=True).indices[..., : self.topk])
        selected = torch.zeros(b, t, s, dtype=torch.bool).scatter_(-1, torch.cat(chosen, dim=1), True)
        return visible & selected.unsqueeze(1)


class DSAttention(MLAttention):
    """MLA reading only the keys its indexer (or, IndexShare, the last full layer's) selects (module note).
    ``indexer`` is set by the layer (None: a shared layer)."""

    def __init__(self, config: DSAHFConfig) -> None:
        super().__init__(config)
        # the latent norms at rms_norm_eps, as megatron-core trains them (and vLLM, SGLang serve them); transformers'
        # classes take 1e-6 whatever it says (GLM-5's 1e-5: its serving note), the same only at 1e-6
        self.q_a_layernorm.eps = self.kv_a_layernorm.eps = config.rms_norm_eps
        self.indexer: Indexer | None = None

    def cache_dims(self) -> dict[str, int]:
        """MLA's entries, and the indexer's key where the layer runs its own indexer."""
        dims = super().cache_dims()
        return dims if self.indexer is None else {**dims, "index_k": self.indexer.head_dim}

    def forward(
        self,
        x: torch.Tensor,
        cos_sin: tuple[torch.Tensor, torch.Tensor],
        cache: KVCache | None,
        rows: Rows,
    ) -> torch.Tensor:
        """Packed tokens [N, h] of ``rows`` in, [N, h] out."""
        query, new, q_latent = self.project(x, cos_sin, rows)
        if self.indexer is not None:
            index_q, index_k = self.indexer.project(x, q_latent, cos_sin)
            new["index_k"] = rows.unpack(index_k)
        kept = cache.write(rows, new) if cache is not None else new
        if self.indexer is not None:
            rows.carried[_CARRIED] = self.indexer.select(x, index_q, kept["index_k"], rows)
        elif _CARRIED not in rows.carried:
            raise RuntimeError("a DSA layer that reuses an earlier layer's top-k ran before any layer with an indexer")
        return self.attend(query, kept, rows.carried[_CARRIED], rows)


def runs_indexer(config: DSAHFConfig, layer_index: int) -> bool:
    """Whether HF layer ``layer_index`` has its own indexer (module note): a decoder layer by ``indexer_types``
    (DeepSeek-V3.2: every layer), MTP depth d by megatron-core's rule for layer number d + 1."""
    layers = config.num_hidden_layers
    if layer_index < layers:
        types = getattr(config, "indexer_types", ())
        return not types or types[layer_index] == "full"
    freq, offset = getattr(config, "index_topk_freq", 1), getattr(config, "index_skip_topk_offset", 1)
    return runs_own_indexer(layer_index - layers + 1, freq, offset)


class DSALayer(MLADecoderLayer):
    """The MLA decoder layer with DSA attention; a family subclasses it with its indexer's RoPE layout."""

    ATTENTION = DSAttention
    INDEX_INTERLEAVE: bool
    """Whether the indexer rotates interleaved pairs (GLM-5) rather than halves (DeepSeek-V3.2)."""
    TITLE: str

    def __init__(self, config: DSAHFConfig, layer_index: int) -> None:
        if config.q_lora_rank is None:
            raise UserError(f"config.json of the {self.TITLE} model has no q_lora_rank; its indexer reads the query "
                            "latent, so the export is malformed; re-export it with a q_lora_rank")
        super().__init__(config, layer_index)
        if runs_indexer(config, layer_index):
            self.self_attn.indexer = Indexer(config, self.INDEX_INTERLEAVE)
        elif layer_index >= config.num_hidden_layers:
            raise UserError(f"MTP layer {layer_index} of the {self.TITLE} model would reuse an earlier layer's top-k "
                            f"(index_topk_freq {config.index_topk_freq}, index_skip_topk_offset "
                            f"{config.index_skip_topk_offset}), which the decoder cannot give it; decode the model "
                            "without its MTP layers (megatron-mtp drop-mtp)")
