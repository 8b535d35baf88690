"""mtp.style: what only one style has is refused in one sentence naming the field; both styles place MTP
layers ('m' in a layout string) on the last stage; the mapping table lists the heads."""

from __future__ import annotations

from pathlib import Path

import pytest

from megatron_mtp.config import load_config, mtp_style
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_mapping import param_table

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny_cpu.yaml")


def _validate(*overrides, world=None):
    cfg = load_config(TINY, list(overrides))
    return validate(cfg, world)


A2A_OVERLAP = ("training.precision=bf16", "training.micro_batch_size=4", "parallel.expert=2", "parallel.pipeline=2",
               "parallel.virtual_pipeline=2", "parallel.moe_a2a_overlap=true")


@pytest.mark.parametrize("overrides,field", [
    # an option only the parallel style has, asked of the sequential one
    (("mtp.head_by_head_backward=true", "training.micro_batch_size=4"), "mtp.head_by_head_backward"),
    # an option only the sequential style has, asked of the parallel one
    (("mtp.style=parallel", *A2A_OVERLAP), "parallel.moe_a2a_overlap"),
])
def test_option_of_the_other_style_is_one_sentence_naming_the_field(overrides, field):
    with pytest.raises(UserError) as info:
        _validate(*overrides, world=4)
    text = str(info.value)
    assert text.startswith(field) and "mtp.style=" in text and text.count(". ") == 0


def test_the_sequential_option_is_fine_with_sequential_modules():
    _validate(*A2A_OVERLAP, world=4)


def test_unknown_style_names_the_choices():
    with pytest.raises(UserError, match="mtp.style is .tree.; it must be one of .sequential., .parallel."):
        load_config(TINY, ["mtp.style=tree"])


@pytest.mark.parametrize("layout", ["Et|tmmL", "Et|t|mmL"])
def test_parallel_heads_are_placed_like_mtp_layers(layout):
    _validate("mtp.style=parallel", "mtp.num_layers=2", "model.num_layers=2", "parallel.pipeline=" +
              str(layout.count("|") + 1), f"parallel.pipeline_layout={layout}")


def test_parallel_heads_on_an_earlier_stage_are_refused():
    with pytest.raises(UserError, match="must put all MTP layers after the last decoder layer"):
        _validate("mtp.style=parallel", "mtp.num_layers=1", "model.num_layers=2", "parallel.pipeline=2",
                  "parallel.pipeline_layout=Etm|tL")


def test_full_recompute_leaves_the_heads_alone():
    """uniform recompute of several layers per chunk is refused for sequential MTP only (heads are not recomputed)"""
    common = ("model.num_layers=4", "recompute.granularity=full", "recompute.method=uniform", "recompute.num_layers=2")
    with pytest.raises(UserError, match="recompute.num_layers=1"):
        _validate(*common)
    _validate(*common, "mtp.style=parallel")


def test_mapping_table_lists_the_heads():
    cfg = load_config(TINY, ["mtp.style=parallel", "mtp.num_layers=2"])
    table = param_table(cfg.model, 2, spec="te", style="parallel")
    heads = [p for p in table if p.part == "mtp"]
    assert {p.mcore.split(".")[2] for p in heads} == {"0", "1"}
    assert all(p.mcore.startswith("mtp_heads.layers.") for p in heads)
    assert all(name.startswith("heads.") for p in heads for name in p.hf_names())
    assert "mtp_heads.layers.1.final_layernorm.weight" in {p.mcore for p in heads}
    sequential = [p for p in param_table(cfg.model, 2, spec="te") if p.part == "mtp"]
    # a head is a sequential module without enorm/hnorm/eh_proj and the embedding/head copies
    assert len(sequential) - len(heads) == 2 * 5


def test_a_style_for_any_family_is_built_by_every_family_without_naming_it(monkeypatch):
    """A style with ``any_family`` (one that reads only the target's hidden states, as EAGLE-3 does) passes every
    family's check without being in its MTP_STYLES; one without the trait is refused where it is not named. The
    toy styles leave the registry as they came. (The family's own checks are not the point: DeepSeek-V3.2 refuses
    megatron-core 0.16 there.)"""
    from dataclasses import replace

    from megatron_mtp.config import mtp_style
    from megatron_mtp.config.validate import check_family
    from megatron_mtp.models.family import families

    parallel = mtp_style.get_style("parallel")
    toy = mtp_style.register_style(replace(parallel, name="toy_any", key_prefix="mtp_toy.", any_family=True))
    narrow = mtp_style.register_style(replace(parallel, name="toy_narrow", key_prefix="mtp_toy."))
    try:
        for family in families():
            config = ROOT / "configs" / f"{family.name}_tiny_cpu.yaml"
            cfg = load_config(str(config) if config.is_file() else TINY, [f"mtp.style={toy.name}"])
            assert cfg.model.family == family.name and toy.name not in cfg.model.MTP_STYLES
            monkeypatch.setattr(type(cfg.model), "check", lambda self, cfg: None)
            check_family(cfg)
            assert toy.name in family.mtp_styles and narrow.name not in family.mtp_styles
            cfg.mtp.style = narrow.name
            with pytest.raises(UserError, match=f"mtp.style=toy_narrow is not built for model.family={family.name} "
                                                f"\\(it builds .*toy_any\\)"):
                check_family(cfg)
    finally:
        for style in (toy, narrow):
            mtp_style._REGISTRY.pop(style.name, None)
    assert [s.name for s in mtp_style.styles()] == list(mtp_style.BUILT_IN)


def test_the_styles_option_sections_are_their_options_classes():
    """``mtp.assistant`` and ``mtp.eagle3`` are sections of the styles' own ``options`` classes (their folders'
    options.py), not fields of MTPConfig; MTPConfig built directly has them too."""
    import dataclasses

    from megatron_mtp.config.model import MTPConfig

    own = {f.name for f in dataclasses.fields(MTPConfig)}
    mtp = MTPConfig(num_layers=2)
    for style in mtp_style.styles():
        if style.options is not None:
            options = style.options()
            assert style.name not in own and isinstance(getattr(mtp, style.name), options)
            assert options.__module__ == f"megatron_mtp.mtp_styles.{style.name}.options"
    assert {"assistant", "eagle3"} <= {s.name for s in mtp_style.styles() if s.options is not None}
