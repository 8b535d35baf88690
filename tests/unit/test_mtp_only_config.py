"""mtp.freeze_base and mtp.targets: what they need is refused in one sentence naming the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")
LOAD = "checkpoint.load=/some/run"


def _validate(*overrides):
    world = 4 if "parallel.expert=2" in overrides else 1
    return validate(load_config(TINY, list(overrides)), world)


@pytest.mark.parametrize("overrides,needs", [
    ((), "checkpoint.load"),
    ((LOAD, "mtp.num_layers=0"), "mtp.num_layers > 0"),
    ((LOAD, "mtp.style=parallel", "mtp.head_by_head_backward=true"), "mtp.head_by_head_backward=false"),
])
def test_freeze_base_without_what_it_needs_is_one_sentence(overrides, needs):
    with pytest.raises(UserError) as info:
        _validate("mtp.freeze_base=true", *overrides)
    text = str(info.value)
    assert text.startswith("mtp.freeze_base") and needs in text and text.count(". ") == 0


@pytest.mark.parametrize("style", [("mtp.targets=self",), ("mtp.style=parallel",)])
def test_freeze_base_with_a_model_to_load_is_fine(style):
    _validate("mtp.freeze_base=true", LOAD, *style)


@pytest.mark.parametrize("overrides,field", [
    (("mtp.targets=self", "mtp.num_layers=0"), "mtp.targets=self"),
    (("mtp.targets=mix", "mtp.style=parallel"), "mtp.targets=mix"),
    (("mtp.targets=mix", "mtp.self_weight=1.5"), "mtp.self_weight"),
    (("mtp.targets=self", "mtp.self_temperature=0"), "mtp.self_weight"),
    (("mtp.targets=self", "training.precision=bf16", "training.micro_batch_size=4", "parallel.expert=2",
      "parallel.pipeline=2", "parallel.virtual_pipeline=2", "parallel.moe_a2a_overlap=true"), "mtp.targets=self"),
])
def test_targets_outside_their_range_are_one_sentence(overrides, field):
    with pytest.raises(UserError) as info:
        _validate(*overrides)
    assert str(info.value).startswith(field) and str(info.value).count(". ") == 0


def test_unknown_target_names_the_choices():
    with pytest.raises(UserError, match="mtp.targets is .teacher.; it must be one of .tokens., .self., .mix."):
        load_config(TINY, ["mtp.targets=teacher"])


def test_resume_may_not_turn_freeze_base_on_or_off(tmp_path):
    from megatron_mtp.checkpoint.resume_rules import refuse_meaning_changes

    frozen = load_config(TINY, ["mtp.freeze_base=true", LOAD])
    joint = load_config(TINY, [LOAD])
    refuse_meaning_changes(frozen, frozen, tmp_path / "step_0000003", tmp_path)
    for saved, now in ((frozen, joint), (joint, frozen)):
        with pytest.raises(UserError) as info:
            refuse_meaning_changes(saved, now, tmp_path / "step_0000003", tmp_path)
        text = str(info.value)
        assert "mtp.freeze_base is" in text and "checkpoint.load_optimizer=false" in text and text.count(". ") == 0


def _tiny(*overrides: str):
    return load_config(TINY, ["model.vocab_size=4096", *overrides])


@pytest.mark.parametrize("saved, now, notes", [
    ((), ("data.tokenizer=/another/copy", "data.paths=[/d]"), []),  # the data may change, the vocabulary not
    (("mtp.num_layers=0",), ("mtp.num_layers=2", "checkpoint.load_optimizer=false"), []),  # new modules: mtp.init
    (("mtp.num_layers=1",), ("mtp.num_layers=3", "mtp.repeated_layer=true"), []),  # its one module is module 0
    (("mtp.num_layers=3",), ("mtp.num_layers=3", "mtp.repeated_layer=true"), ["leaves out mtp.layers.1, mtp.layers.2"]),
    (("mtp.num_layers=2",), ("mtp.num_layers=1",), ["leaves out mtp.layers.1"]),
    # another style: the checkpoint's modules are left out, the heads drawn anew (or copied: mtp.init)
    (("mtp.num_layers=2",), ("mtp.style=parallel", "mtp.num_layers=3", "checkpoint.load_optimizer=false"),
     ["has 2 sequential MTP modules; this run loads 3 parallel MTP heads and leaves out mtp.layers.0, mtp.layers.1"]),
    (("mtp.style=parallel", "mtp.num_layers=1"), ("mtp.style=parallel", "mtp.num_layers=2", "mtp.freeze_base=true",
                                                  "checkpoint.load=/some/run"), []),
    (("parallel.tensor=2",), ("parallel.tensor=1", "optimizer.lr=1e-5"), []),  # the same padded vocabulary
])
def test_what_a_weights_only_load_may_change(saved, now, notes, tmp_path):
    from megatron_mtp.checkpoint.resume_rules import refuse_load_changes

    got = refuse_load_changes(_tiny(*saved), _tiny(*now), tmp_path, _tiny(*now).checkpoint.load_optimizer)
    assert len(got) == len(notes) and all(n in g for n, g in zip(notes, got)), got


@pytest.mark.parametrize("saved, now, words", [
    ((), ("model.make_vocab_size_divisible_by=1000",), "the padded vocabulary is 4096 in the checkpoint and 5000"),
    ((), ("model.vocab_size=8192",), "model.vocab_size is 4096 in the checkpoint and 8192 now"),
    ((), ("model.family=glm4_moe",), "model.family is 'deepseek_v3' in the checkpoint and 'glm4_moe' now"),
    (("mtp.num_layers=2",), ("mtp.style=parallel", "mtp.num_layers=2"),
     r"this run adds MTP parts \(the checkpoint has 2 sequential MTP modules, this run 2 parallel MTP heads\)"),
    (("mtp.num_layers=0",), ("mtp.num_layers=1",), "set checkpoint.load_optimizer=false"),
])
def test_what_a_weights_only_load_may_not_change_is_one_sentence(saved, now, words, tmp_path):
    from megatron_mtp.checkpoint.resume_rules import refuse_load_changes
    from megatron_mtp.errors import is_one_sentence

    after = _tiny(*now)
    with pytest.raises(UserError, match=words) as err:
        refuse_load_changes(_tiny(*saved), after, tmp_path, after.checkpoint.load_optimizer)
    assert is_one_sentence(str(err.value)) and str(err.value).startswith(
        f"cannot start this run from checkpoint.load={tmp_path}:")
