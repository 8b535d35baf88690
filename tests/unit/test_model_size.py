"""Analytic sizes match the model megatron-core builds and the published sizes (DeepSeek-V3, Qwen3-MoE)."""

from __future__ import annotations

from pathlib import Path

from megatron_mtp.config import load_config
from megatron_mtp.config.vocab import padded_vocab_size
from megatron_mtp.models.deepseek_v3.sizes import parameter_counts

ROOT = Path(__file__).resolve().parents[2]


def test_deepseek_v3_671b_matches_published_size():
    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    counts = parameter_counts(cfg, padded_vocab_size(cfg.model.vocab_size, cfg))
    assert abs(counts["main"] / 671e9 - 1) < 0.01, counts  # 671B main model
    assert abs(counts["main_active"] / 37e9 - 1) < 0.03, counts  # 37B activated per token
    assert abs(counts["mtp_unique"] / 11.5e9 - 1) < 0.02, counts  # ~11.5B unique MTP parameters


def test_qwen3_moe_release_shapes_match_their_published_sizes():
    """Qwen3-30B-A3B: 30.5B total, 3.3B activated; Qwen3-235B-A22B: 235B and 22B (the model cards' counts:
    embedding and output layer included, the MTP module ours and apart)."""
    from megatron_mtp.models.family import get_family

    for name, total, active in (("qwen3_30b_a3b", 30.5e9, 3.3e9), ("qwen3_235b_a22b", 235e9, 22e9)):
        cfg = load_config(str(ROOT / "configs" / f"{name}.yaml"))
        counts = get_family("qwen3_moe").parameter_counts(cfg, padded_vocab_size(cfg.model.vocab_size, cfg))
        assert abs(counts["main"] / total - 1) < 0.01, (name, counts)
        assert abs(counts["main_active"] / active - 1) < 0.02, (name, counts)
        assert cfg.model.moe_layer_rule().count == cfg.model.num_layers  # every layer MoE, as released


def _v3_flops_by_hand(cfg, vocab: int, experts_counted: int) -> float:
    """DeepSeek-V3's training FLOPs per token counted from its published shape, apart from models/sizes.py:
    6 × the matmul weights a token passes through (embedding lookup excluded, output head included) plus,
    per layer, causal attention's QK^T and AV over half the sequence on average, 3 × (forward) in all.
    ``experts_counted``: routed experts a MoE layer's token runs through (top-k; all of them is the mistake
    the check must catch)."""
    m = cfg.model
    h, heads, seq = m.hidden_size, m.num_attention_heads, cfg.training.seq_length
    qk, rope, v = m.qk_head_dim, m.qk_pos_emb_head_dim, m.v_head_dim
    mla = (h * m.q_lora_rank + m.q_lora_rank * heads * (qk + rope)  # query down and up
           + h * (m.kv_lora_rank + rope) + m.kv_lora_rank * heads * (qk + v)  # key/value latent + shared rope key, up
           + heads * v * h)  # output projection
    dense_mlp = 3 * h * m.ffn_hidden_size  # gate, up, down
    expert = 3 * h * m.moe_ffn_hidden_size
    moe_mlp = m.num_experts * h + (experts_counted + m.num_shared_experts) * expert  # router, routed, shared
    scores = 2 * heads * (qk + rope + v) * seq / 2  # QK^T and AV, causal
    dense_layers, moe_layers = m.first_k_dense, m.num_layers - m.first_k_dense
    head = vocab * h
    forward = (dense_layers * (2 * (mla + dense_mlp) + scores) + moe_layers * (2 * (mla + moe_mlp) + scores)
               + 2 * head)
    mtp = 2 * (mla + moe_mlp + 2 * h * h) + scores + 2 * head  # its MoE layer, eh_proj over [h; e], the head
    return 3 * (forward + cfg.mtp.num_layers * mtp)


def test_671b_training_flops_are_the_routed_experts_not_all_of_them():
    """The trainer's and plan's FLOPs (models/throughput.py) against an independent count: within 0.1% (the
    function also counts MLA's two latent norm weights), and nowhere near a count of every expert."""
    from megatron_mtp.models.throughput import model_flops_per_token

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
    got = model_flops_per_token(cfg, vocab)
    want = _v3_flops_by_hand(cfg, vocab, cfg.model.router_topk)
    assert abs(got / want - 1) < 1e-3, (got, want)
    assert got / _v3_flops_by_hand(cfg, vocab, cfg.model.num_experts) < 0.2  # every expert: over 5× more
    # 6 × the published 37B active parameters, plus attention's scores and the MTP module
    assert 6 * 37e9 < got < 6 * 37e9 * 1.4
    # top-k 8 -> 4: four routed experts fewer in each of the 58 MoE layers and the MTP module's
    fewer = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), ["model.router_topk=4"])
    expert = 3 * cfg.model.hidden_size * cfg.model.moe_ffn_hidden_size
    assert got - model_flops_per_token(fewer, vocab) == 6 * 4 * expert * (58 + 1)
