"""The model family: one config field, one interface, recorded in checkpoints and fixed on resume."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.checkpoint.resume_rules import MEANING
from megatron_mtp.config import load_config
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import FAMILIES, INTERFACE, get_family

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", FAMILIES)
def test_every_family_provides_the_interface(name):
    family = get_family(name)
    for attr in INTERFACE:
        assert getattr(family, attr) is not None, attr


def test_deepseek_v3_is_the_default_and_others_are_refused():
    assert load_config(None).model.family == "deepseek_v3"
    with pytest.raises(UserError, match="model.family"):
        load_config(None, ["model.family=glm4_moe_unknown"])
    with pytest.raises(UserError, match="not a model family"):
        get_family("gpt2")


def test_a_resume_may_not_change_the_family():
    assert "model.family" in MEANING


def test_the_family_table_decides_moe_layers_once():
    """The tensor table, the megatron-core layer pattern and plan agree on which layers are MoE."""
    from megatron_mtp.models.deepseek_v3.transformer_config import moe_layer_pattern
    from megatron_mtp.plan.params import is_moe_layer, mtp_is_moe

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"))
    family = get_family(cfg.model.family)
    table = [family.is_moe_layer(cfg.model, i) for i in range(cfg.model.num_layers)]
    assert table == [bool(x) for x in moe_layer_pattern(cfg)] == [is_moe_layer(cfg, i) for i in range(61)]
    assert table[:3] == [False] * 3 and all(table[3:]) and mtp_is_moe(cfg)
