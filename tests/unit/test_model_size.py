"""Analytic sizes match the model megatron-core builds and DeepSeek-V3's published size."""

from __future__ import annotations

import subprocess
import sys
import textwrap
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


def test_counts_equal_the_built_tiny_model():
    code = textwrap.dedent(f"""
        import json
        from megatron_mtp.config import load_config
        from megatron_mtp.platform import setup
        from megatron_mtp.training.distributed import init_distributed, destroy
        from megatron_mtp.models.deepseek_v3.transformer_config import build_transformer_config
        from megatron_mtp.models.deepseek_v3.model import build_model
        cfg = load_config("{ROOT / 'configs' / 'tiny_cpu.yaml'}", ["model.vocab_size=256", "mtp.num_layers=2"])
        plat = setup("cpu"); init_distributed(cfg, plat)
        model = build_model(cfg, build_transformer_config(cfg, plat), plat, 256, True, True)
        main = sum(p.numel() for n, p in model.named_parameters() if not n.startswith("mtp."))
        mtp = sum(p.numel() for n, p in model.named_parameters() if n.startswith("mtp."))
        print(json.dumps([main, mtp])); destroy()
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    main, mtp = __import__("json").loads(out.stdout.strip().splitlines()[-1])
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), ["model.vocab_size=256", "mtp.num_layers=2"])
    counts = parameter_counts(cfg, 256)
    assert counts["main"] == main
    assert counts["mtp_unique"] == mtp
