"""mtp.style eagle3: its drafter's fields resolve from the target's (speculators' default aux layers, the target's
heads and MLP width), it always trains on a frozen target, and what it does not build yet is one sentence naming the
field; its plan counts the drafter's parameters as trained; the draft vocabulary is the most frequent tokens, ties
to the lower id, as speculators picks it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.mtp_styles.eagle3.shape import drafter_shape
from megatron_mtp.platform.gpus import parse_gpu

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
EAGLE3 = ("mtp.style=eagle3", "mtp.num_layers=3", "checkpoint.load=/somewhere", "model.num_layers=8",
          "model.vocab_size=1024")


def _validate(*overrides, world=None):
    return validate(load_config(TINY, [*EAGLE3, *overrides]), world)


def test_the_drafter_takes_the_targets_widths_and_speculators_default_layers():
    cfg = load_config(TINY, [*EAGLE3, "mtp.eagle3.draft_vocab_size=256"])
    assert cfg.mtp.freeze_base  # a separate drafter always trains beside a frozen target
    validate(cfg, None)
    s = drafter_shape(cfg)
    assert s.aux_layers == (2, 4, 5) and (s.heads, s.groups, s.head_dim, s.ffn) == (4, 4, 32, 384)
    assert (s.vocab, s.draft_vocab, s.restricted) == (1024, 256, True)


@pytest.mark.parametrize("overrides,says", [
    (("mtp.freeze_base=false",), "mtp.freeze_base=false does not work with mtp.style=eagle3"),
    (("model.num_layers=4",), r"speculators' default aux layers \[2, 2, 1\] must be distinct"),
    (("mtp.eagle3.aux_layers=[1,9]",), r"mtp.eagle3.aux_layers \[1, 9\] must be distinct layer ids within 0..8"),
    (("mtp.eagle3.num_query_groups=3",), "mtp.eagle3.num_query_groups=3 does not divide its 4 query heads"),
    (("mtp.eagle3.draft_vocab_size=2000",), "mtp.eagle3.draft_vocab_size=2000 exceeds the target's vocabulary"),
    (("parallel.pipeline=2",), "parallel.pipeline=2 is not built yet for mtp.style=eagle3, whose drafter on the last "
                               "stage reads the target's hidden states"),
    (("parallel.context=2",), "parallel.context=2 does not work with mtp.style=eagle3 yet"),
    (("parallel.tensor=2", "mtp.eagle3.draft_vocab_size=255"), r"the EAGLE-3 drafter's draft vocabulary size \(255\) "
                                                               "is not a multiple of parallel.tensor=2"),
    (("parallel.tensor=2", "mtp.eagle3.num_query_groups=1"), r"number of key/value heads \(1\) is not a multiple"),
    (("mtp.targets=self",), "mtp.targets=self needs"),
])
def test_what_the_drafter_cannot_take_is_one_sentence(overrides, says):
    with pytest.raises(UserError, match=says) as info:
        _validate(*overrides, world=2)
    assert str(info.value).count(". ") == 0


def test_plan_counts_the_drafter_as_trained():
    from megatron_mtp.mtp_styles.eagle3 import plan as eagle3_plan
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.plan.params import trains

    cfg = load_config(TINY, [*EAGLE3, "mtp.eagle3.draft_vocab_size=256", "mtp.eagle3.aux_layers=[1,4,8]"])
    plan = make_plan(cfg, 1, parse_gpu("h100"), cpu=True)
    assert plan.worst.total > 0 and any("an EAGLE-3 drafter" in a for a in plan.assumptions)

    stage = type("Stage", (), {"mtp_layers": 3})()
    params = eagle3_plan.params(cfg, None, stage, 1024, False)
    h = 128
    assert params[0].numel == 3 * h * h and params[-1].numel == 256 * h  # fc over three layers, the draft head
    assert all(trains(cfg, p) for p in params)


def test_the_draft_vocabulary_is_the_most_frequent_tokens():
    from megatron_mtp.mtp_styles.eagle3.vocab import draft_vocabulary

    counts = torch.tensor([5, 0, 9, 9, 1, 0, 3, 0])
    d2t, t2d = draft_vocabulary(counts, 5)
    ids = torch.arange(5) + d2t
    assert ids.tolist() == [0, 2, 3, 4, 6] and t2d.nonzero().flatten().tolist() == ids.tolist()
    d2t, t2d = draft_vocabulary(counts, 7)  # fewer seen than asked: the lowest unseen ids fill in
    assert (torch.arange(7) + d2t).tolist() == [0, 1, 2, 3, 4, 5, 6]


def test_its_options_are_its_own_section_mtp_eagle3():
    """The style's ``options`` class (its folder's options.py) is the section mtp.eagle3: defaults in a new Config,
    overrides and mappings with unknown keys refused, the config.yaml round trip, ``train --help-config``."""
    from megatron_mtp.config import Config
    from megatron_mtp.config.base import describe
    from megatron_mtp.config.mtp_style import get_style
    from megatron_mtp.config.root import config_from_dict

    options = get_style("eagle3").options()
    assert options.__module__ == "megatron_mtp.mtp_styles.eagle3.options"
    assert isinstance(Config().mtp.eagle3, options) and Config().mtp.eagle3.num_layers == 1
    cfg = load_config(TINY, [*EAGLE3, "mtp.eagle3.aux_layers=[1,4,8]"])
    assert cfg.mtp.eagle3.aux_layers == [1, 4, 8] and config_from_dict(cfg.to_dict()) == cfg
    assert cfg.replace(name="other").mtp == cfg.mtp
    with pytest.raises(UserError, match=r"unknown config key 'mtp.eagle3.aux_layer'.*did you mean 'aux_layers'"):
        load_config(TINY, ["mtp.eagle3.aux_layer=[1]"])
    with pytest.raises(UserError, match=r"unknown config key 'mtp.eagle3.bogus'"):
        config_from_dict({"mtp": {"eagle3": {"bogus": 1}}})
    rows = {key: doc for key, _, doc in describe(Config)}
    assert rows["mtp.eagle3.aux_layers"].startswith("[mtp.style=eagle3] The target's hidden states")
    assert "eagle3: an EAGLE-3 drafter" in rows["mtp.style"]


def test_every_family_builds_it_and_its_counts_are_the_styles():
    """``any_family``: no family names it; an MTP-only step's FLOPs are its ``drafter_flops``; the converter's
    shapes of its tensors are the plan's parameters and its two vocabulary tables."""
    from megatron_mtp.config.mtp_style import get_style
    from megatron_mtp.models.family import families, get_family
    from megatron_mtp.models.sizes import mtp_only_flops_per_token
    from megatron_mtp.mtp_styles.eagle3 import plan as eagle3_plan
    from megatron_mtp.mtp_styles.eagle3.shape import BUFFERS

    assert all("eagle3" in family.mtp_styles and "eagle3" not in family.model_config.MTP_STYLES
               for family in families())
    cfg = load_config(TINY, [*EAGLE3, "mtp.eagle3.draft_vocab_size=256"])
    family, style = get_family(cfg.model.family), get_style("eagle3")
    base = family.training_flops_per_token(cfg, 1024, 0) / 3
    step = style.drafter_flops(family, cfg, 1024)
    assert step > 0 and mtp_only_flops_per_token(family, cfg, 1024, 3) == pytest.approx(base + 9 * step)
    shapes = style.convert().drafter_shapes(cfg, 1024)
    params = eagle3_plan.params(cfg, None, type("Stage", (), {"mtp_layers": 3})(), 1024, False)
    assert [p.name for p in params] + list(BUFFERS) == list(shapes)
    assert shapes["mtp_eagle3.lm_head.weight"] == (256, 128) and shapes["mtp_eagle3.t2d"] == (1024,)
