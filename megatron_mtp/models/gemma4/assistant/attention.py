"""The assistant's attention: queries of its own over the frozen target's stored keys and values.

Design note. An assistant layer of kind ``full_attention`` or ``sliding_attention`` has a query projection,
a query norm, RoPE, an output projection and a post-attention norm, and no key or value projection: it
attends to the keys and values the target's last layer of that kind computed in the same forward
(``shared_kv``: [s, b, groups/TP, head], after the target's key norm and RoPE; set by the assistant block
before each step, a reference, never a copy). For the draft step anchored at position t (models/gemma4/
assistant/block.py) the query sits at position t + 1 and sees the target's keys of positions 0..t: the
causal mask of a sequence against itself, every query row one position later for RoPE than its key row.
A sliding layer sees the last ``sliding_window + 1`` of them (transformers' assistant mask shows one key
more than the target's own window; models/gemma4/assistant/decoder.py measured it), so its core attention gets
the window (W, 0) where the target's has (W - 1, 0). The query heads split over tensor-parallel ranks as
the target's key/value heads do, so each rank's queries meet its own shard of the stored keys; with
sequence parallelism the query projection gathers the sequence and the output projection scatters it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

import torch
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule

from megatron_mtp.models.gemma4.attention import attention_tail
from megatron_mtp.models.gemma4.rope import apply_rope, rope_cos_sin


@dataclass
class QueryOnlySubmodules:
    linear_q: Any
    linear_proj: Any
    core_attention: Any
    q_layernorm: Any
    post_layernorm: Any


class QueryOnlyAttention(MegatronModule):
    """One assistant attention block over [s, b, h] and the target's stored (keys, values) (module note)."""

    def __init__(self, config, submodules: QueryOnlySubmodules, layer_number: int, *, head_dim: int,
                 query_groups: int, rope_base: float, rope_share: float, window: Optional[int], pg_collection=None,
                 **_):
        super().__init__(config=config)
        from megatron.core.process_groups_config import ProcessGroupCollection

        pg_collection = pg_collection or ProcessGroupCollection.use_mpu_process_groups()
        self.layer_number, self.head_dim = layer_number, head_dim
        self.heads = config.num_attention_heads // pg_collection.tp.size()
        h = config.hidden_size
        self.linear_q = submodules.linear_q(
            h, config.num_attention_heads * head_dim, config=config, init_method=config.init_method,
            gather_output=False, bias=False, skip_bias_add=False, is_expert=False, tp_comm_buffer_name="q",
            tp_group=pg_collection.tp)
        self.q_layernorm = submodules.q_layernorm(config=config, hidden_size=head_dim, eps=config.layernorm_epsilon)
        # a sliding layer sees one stored key more than the target's own window (module note)
        attention_tail(self, submodules, layer_number, head_dim, query_groups, window, (rope_base, rope_share),
                       pg_collection)
        self.shared_kv: Optional[tuple[torch.Tensor, torch.Tensor]] = None

    def forward(self, hidden_states: torch.Tensor, attention_mask=None, **_):
        keys, values = self.shared_kv
        q, _ = self.linear_q(hidden_states)
        s, b = q.shape[:2]
        q = self.q_layernorm(q.view(s, b, self.heads, self.head_dim))
        cos, sin = rope_cos_sin(self.inv_freq, torch.arange(1, s + 1, device=q.device), q.dtype)
        q = apply_rope(q, cos[:, None, None, :], sin[:, None, None, :])
        out = self.core_attention(q, keys.to(q.dtype), values.to(q.dtype), None, attn_mask_type=AttnMaskType.causal)
        out, bias = self.linear_proj(out)
        return self.post_layernorm(out), bias
