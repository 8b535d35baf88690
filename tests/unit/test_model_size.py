"""Analytic sizes match the model megatron-core builds and DeepSeek-V3's published size."""

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
