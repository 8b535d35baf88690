"""A frozen base's run reports what it trains: its step lines leave out the MoE balance loss the base does not
compute, and its summary gives the base's LM loss without a "best" (training/run_logger.py, run_summary.py)."""

from __future__ import annotations

import json

import yaml

from megatron_mtp.config import load_config
from megatron_mtp.training.run_logger import format_step_line
from megatron_mtp.training.run_summary import format_summary, summarize

ROW = {"train/lm_loss": 2.5, "train/mtp_loss_1": 3.0, "train/mtp_acceptance_1": 0.4, "train/mtp_lambda": 0.3,
       "train/lr": 1e-4, "train/grad_norm": 0.5, "train/grad_norm_max": 0.7, "perf/tokens_per_s": 1000.0,
       "perf/tokens_per_s_per_gpu": 1000.0, "perf/tflops_per_gpu": 1.0, "perf/step_time_s": 0.1,
       "moe/max_violation": 0.2, "moe/balance_loss": 0.0, "perf/memory_gib": 1.0}


def _run(tmp_path, name, overrides):
    run = tmp_path / name
    (run / "logs").mkdir(parents=True)
    rows = [dict(ROW, step=1, **{"train/lm_loss": 2.4}), dict(ROW, step=2)]
    (run / "logs" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (run / "config.yaml").write_text(yaml.safe_dump(load_config(None, overrides).to_dict()))
    return format_summary(summarize(run))


def test_a_frozen_base_reports_no_best_lm_loss_and_no_balance_loss(tmp_path):
    trained = _run(tmp_path, "trained", [])
    assert "lm loss 2.5000 (best 2.4000 at step 1)" in trained
    for overrides in (["mtp.freeze_base=true"], ["mtp.style=assistant"]):  # an assistant freezes its target unasked
        frozen = _run(tmp_path, overrides[0].replace("=", "_"), overrides)
        assert "lm loss 2.5000 (the frozen base's, not trained)" in frozen and "best" not in frozen, frozen
    assert "moe_balance 0.000" in format_step_line(2, 10, ROW, 1)
    line = format_step_line(2, 10, ROW, 1, frozen_base=True)
    assert "moe_balance" not in line and "mtp1_loss 3.0000" in line and "moe_maxvio 0.200" in line
