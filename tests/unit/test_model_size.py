"""Analytic sizes match the model megatron-core builds and the published sizes (DeepSeek-V3, Qwen3-MoE)."""

from __future__ import annotations

from pathlib import Path

from megatron_mtp.config import load_config
from megatron_mtp.config.vocab import padded_vocab_size
from megatron_mtp.models.deepseek_v3.size import parameter_counts

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
