"""Analytic parameter counts and training FLOPs of the DeepSeek-V3-style model.

Used to check configs against published sizes and by benchmarks to predict cost ratios
(e.g. the MTP overhead: step time with D=1 over D=0 should follow the FLOPs ratio).
Counts follow the module structure built by megatron-core (see model.py); vocabulary rows are
counted padded, as they are allocated.
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_mtp.config import Config


@dataclass(frozen=True)
class LayerSizes:
    attention: int
    dense_mlp: int
    moe_total: int  # router + all routed experts + shared experts
    moe_active: int  # router + top-k routed experts + shared experts
    norms: int


def _layer_sizes(cfg: Config) -> LayerSizes:
    m = cfg.model
    h, n = m.hidden_size, m.num_attention_heads
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    if m.q_lora_rank:
        q = h * m.q_lora_rank + m.q_lora_rank + m.q_lora_rank * n * qk
    else:
        q = h * n * qk
    kv_down = h * (m.kv_lora_rank + m.qk_pos_emb_head_dim) + m.kv_lora_rank  # projection + its norm
    kv = kv_down + m.kv_lora_rank * n * (m.qk_head_dim + m.v_head_dim)
    attention = q + kv + n * m.v_head_dim * h
    expert = 3 * h * m.moe_ffn_hidden_size
    shared = 3 * h * m.moe_ffn_hidden_size * m.num_shared_experts
    router = m.num_experts * h
    return LayerSizes(
        attention=attention,
        dense_mlp=3 * h * m.ffn_hidden_size,
        moe_total=router + m.num_experts * expert + shared,
        moe_active=router + m.router_topk * expert + shared,
        norms=2 * h,
    )


def parameter_counts(cfg: Config, padded_vocab: int) -> dict[str, int]:
    """{'main': ..., 'mtp_unique': ..., 'main_active': ...} (MTP shares embedding and head)."""
    m = cfg.model
    s = _layer_sizes(cfg)
    moe_layers = m.num_layers - m.first_k_dense if m.num_experts else 0
    dense_layers = m.num_layers - moe_layers
    per_layer_common = s.attention + s.norms
    mlp_total = dense_layers * s.dense_mlp + moe_layers * s.moe_total
    mlp_active = dense_layers * s.dense_mlp + moe_layers * s.moe_active
    embed = padded_vocab * m.hidden_size
    head = 0 if m.tie_embeddings else padded_vocab * m.hidden_size
    main = m.num_layers * per_layer_common + mlp_total + embed + head + m.hidden_size
    mtp_mlp = s.moe_total if m.num_experts else s.dense_mlp
    if cfg.mtp.style == "parallel":  # a head: one layer and its final norm (parallel_heads.py)
        mtp_layer = per_layer_common + mtp_mlp + m.hidden_size
    else:  # enorm, hnorm, eh_proj [h, 2h], final norm
        mtp_layer = per_layer_common + mtp_mlp + 2 * m.hidden_size * m.hidden_size + 3 * m.hidden_size
    return {
        "main": main,
        "main_active": m.num_layers * per_layer_common + mlp_active + embed + head + m.hidden_size,
        "mtp_unique": cfg.mtp.num_layers * mtp_layer,
    }


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """Forward+backward FLOPs per token (3 × forward), matmuls and attention scores."""
    m = cfg.model
    s = _layer_sizes(cfg)
    seq = cfg.training.seq_length
    n = m.num_attention_heads
    qk = m.qk_head_dim + m.qk_pos_emb_head_dim
    # causal attention: QK^T and AV over (on average) half the sequence
    attn_scores = 2 * n * (qk + m.v_head_dim) * seq / 2
    moe_layers = m.num_layers - m.first_k_dense if m.num_experts else 0
    dense_layers = m.num_layers - moe_layers
    mlp_active = s.moe_active if m.num_experts else s.dense_mlp
    layer = lambda mlp: 2 * (s.attention + mlp) + attn_scores  # noqa: E731
    head = 2 * padded_vocab * m.hidden_size
    forward = dense_layers * layer(s.dense_mlp) + moe_layers * layer(s.moe_active) + head
    eh_proj = 0 if cfg.mtp.style == "parallel" else 2 * 2 * m.hidden_size * m.hidden_size
    forward += mtp_layers * (layer(mlp_active) + eh_proj + head)
    return 3.0 * forward
