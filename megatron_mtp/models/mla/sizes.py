"""What the MLA families' analytic sizes share: MLA's score width and its attention shape."""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.family import AttentionShape


def attention_score_width(cfg: Config) -> int:
    """MLA's per-token score width: each head's query-key (no-RoPE + RoPE part) and value dims."""
    m = cfg.model
    return m.num_attention_heads * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)



def attention_shape(m) -> AttentionShape:
    """MLA's widths: each head's query-key (no-RoPE + RoPE part) and value, the shared rotary key, the
    query and key/value latents."""
    return AttentionShape(qk_dim=m.qk_head_dim + m.qk_pos_emb_head_dim, v_dim=m.v_head_dim,
                          rope_dim=m.qk_pos_emb_head_dim, q_lora=m.q_lora_rank, kv_lora=m.kv_lora_rank)
