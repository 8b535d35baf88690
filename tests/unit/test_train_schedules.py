"""λ schedule by consumed tokens, and the pipeline layout translation."""

from __future__ import annotations

from megatron_mtp.config import load_config
from megatron_mtp.models.deepseek_v3.transformer_config import megatron_layout, moe_layer_pattern
from megatron_mtp.training.schedules import mtp_lambda


def test_lambda_follows_consumed_tokens():
    cfg = load_config(None, ["mtp.loss_weight_schedule=[[10000000000000, 0.1], [0, 0.3]]"])
    assert mtp_lambda(cfg, 0) == 0.3
    assert mtp_lambda(cfg, 10**13 - 1) == 0.3
    assert mtp_lambda(cfg, 10**13) == 0.1
    assert mtp_lambda(cfg, 10**15) == 0.1


def test_lambda_is_zero_before_first_entry():
    cfg = load_config(None, ["mtp.loss_weight_schedule=[[100, 0.5]]"])
    assert mtp_lambda(cfg, 99) == 0.0
    assert mtp_lambda(cfg, 100) == 0.5


def test_moe_pattern_and_pipeline_layout():
    cfg = load_config(None, ["model.num_layers=5", "model.first_k_dense=2", "parallel.pipeline=2",
                             "parallel.pipeline_layout=[2,3]", "mtp.num_layers=2"])
    assert moe_layer_pattern(cfg) == [0, 0, 1, 1, 1]
    assert megatron_layout(cfg) == ("Ett|tttmmL", 1)
