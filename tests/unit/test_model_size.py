"""Analytic sizes match the model megatron-core builds and the published sizes (DeepSeek-V3, Qwen3-MoE, GLM-5)."""

from __future__ import annotations

from pathlib import Path

import pytest

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


def test_glm5_release_counts_as_transformers_does():
    """configs/glm5.yaml is GLM-5's release shape: its main model has exactly the parameters transformers'
    GlmMoeDsaForCausalLM builds for the default GlmMoeDsaConfig (GLM-5's, on the meta device: 743.9B, the card's
    744B), and 39.9B of them active per token besides the embedding and the output head (the card's 40B)."""
    import dataclasses

    transformers = pytest.importorskip("transformers")
    if not hasattr(transformers, "GlmMoeDsaForCausalLM"):
        pytest.skip("this transformers has no GLM-5")
    import torch

    from megatron_mtp.models.family import get_family

    cfg = load_config(str(ROOT / "configs" / "glm5.yaml"))
    with torch.device("meta"):
        model = transformers.GlmMoeDsaForCausalLM(transformers.GlmMoeDsaConfig())
    assert model.config.num_hidden_layers == cfg.model.num_layers == 78 and len(model.model.layers) == 78
    vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
    counts = get_family("glm_moe_dsa").parameter_counts(
        dataclasses.replace(cfg, mtp=dataclasses.replace(cfg.mtp, num_layers=0)), vocab)
    assert counts["main"] == sum(p.numel() for p in model.parameters())
    assert round(counts["main"] / 1e9) == 744
    assert round((counts["main_active"] - 2 * vocab * cfg.model.hidden_size) / 1e9) == 40


def test_dsa_indexer_and_sparse_attention_counted_by_hand():
    """The DSA families' indexer parameters and attention FLOPs from the widths alone (models/dsa/sizes.py's
    module note): configs/glm_moe_dsa_tiny_cpu.yaml has 3 layers of which layer 1 reuses layer 0's top-k, one MTP layer
    with its own indexer, 4 heads, kv_lora 32, rope 16, qk 32, v 32, a 4 × 32 indexer on q_lora 64 and hidden
    128, the top 16 of 128 tokens; the same model as DeepSeek-V3 (no indexer, dense MLA) is the reference."""
    from megatron_mtp.config import config_from_dict
    from megatron_mtp.models.family import get_family

    glm = get_family("glm_moe_dsa")
    config = str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml")
    tiny = load_config(config, ["model.vocab_size=4096"])
    every = load_config(config, ["model.vocab_size=4096", "model.index_topk_freq=1"])
    raw = tiny.to_dict()
    raw["model"] = {k: v for k, v in raw["model"].items() if not k.startswith("index")}
    v3 = config_from_dict({**raw, "model": {**raw["model"], "family": "deepseek_v3"}})
    indexer = 4 * 32 * 64 + 32 * 128 + 2 * 32 + 4 * 128  # wq_b, wk, k_norm's weight and bias, weights_proj
    counts = {name: f.parameter_counts(c, 4096) for name, f, c in (("shared", glm, tiny), ("every", glm, every),
                                                                   ("v3", get_family("deepseek_v3"), v3))}
    assert counts["every"]["main"] - counts["shared"]["main"] == indexer  # layer 1 has none
    assert counts["every"]["main"] - counts["v3"]["main"] == 3 * indexer
    assert counts["shared"]["mtp_unique"] - counts["v3"]["mtp_unique"] == indexer  # the MTP layer runs its own
    # forward FLOPs per token and layer at 128 tokens
    index_scores = 2 * 4 * (32 + 1) * 128 / 2  # every indexer head with every earlier token, then the head sum
    top_k = 2 * 4 * (2 * 32 + 16) * (16 - 16 * 16 / (2 * 128))  # absorbed MLA over min(t, 16) keys on average
    dense = 2 * 4 * (32 + 16 + 32) * 128 / 2
    assert glm.attention_costs(tiny) == {
        "seq_length": 128, "index_topk": 16, "layers": 3, "indexer_layers": 2,
        "indexer_flops_per_token": 3 * 2 * index_scores, "sparse_mla_flops_per_token": 3 * 3 * top_k,
        "dense_mla_flops_per_token": 3 * 3 * dense}
    layers = 3 + 1  # with the MTP layer, which runs its own indexer
    extra = layers * top_k + 3 * index_scores - layers * dense + 2 * 3 * indexer  # + the indexers' weights
    ours = glm.training_flops_per_token(tiny, 4096, 1) - get_family("deepseek_v3").training_flops_per_token(v3, 4096, 1)
    assert ours == pytest.approx(3 * extra, rel=1e-12)
    # GLM-5's release at 128K: the indexer over every earlier token, MLA over 2,048 of them, dense MLA over all
    release = load_config(str(ROOT / "configs" / "glm5.yaml"), ["training.seq_length=131072"])
    costs = glm.attention_costs(release)
    assert costs["dense_mla_flops_per_token"] == 3 * 78 * 2 * 64 * (192 + 64 + 256) * 65536
    assert costs["sparse_mla_flops_per_token"] == pytest.approx(3 * 78 * 2 * 64 * 1088 * (2048 - 2048 ** 2 / 262144))
    assert costs["indexer_flops_per_token"] == 3 * 78 * 2 * 32 * 129 * 65536
    dsa = costs["sparse_mla_flops_per_token"] + costs["indexer_flops_per_token"]
    assert 5 < costs["dense_mla_flops_per_token"] / dsa < 5.3  # 1,005 GFLOP against 193


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
