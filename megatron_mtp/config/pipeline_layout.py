"""Which layers each pipeline stage (and virtual chunk) holds: one answer for validation, training
and `plan`.

megatron-core receives the same placement as a layout string (E embedding, t decoder layer, m MTP
layer, L loss, | between stages, (..)*n repeats); stage i of the string runs on pipeline rank
i % PP as virtual chunk i // PP. This module turns the config (an even split, decoder layers per
stage, or a layout string) into those stages and checks them, so a bad placement is one sentence
before any process starts; tests/unit/test_pipeline_layout.py checks that megatron-core's own
parser reads our strings the same way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from megatron_mtp.errors import UserError

_REPEAT_GROUP = re.compile(r"\(([^()]+)\)\*(\d+)")
_REPEAT_CHAR = re.compile(r"(.)\*(\d+)")


@dataclass(frozen=True)
class Stage:
    """One (pipeline rank, virtual chunk) of the model."""

    pp_rank: int
    vp_stage: int
    layers: tuple[int, ...]
    """Global indices of the decoder layers it holds, in order."""
    embedding: bool
    mtp_layers: int
    loss: bool


def unroll(layout: str) -> list[str]:
    """Stage strings of a layout string, repetitions expanded ('Et|(tt|)*2mL' -> ['Et', 'tt', 'tt', 'mL'])."""
    text = layout.replace(",", "").replace(" ", "")
    previous = None
    while previous != text:
        previous, text = text, _REPEAT_GROUP.sub(lambda m: m.group(1) * int(m.group(2)), text)
    text = _REPEAT_CHAR.sub(lambda m: m.group(1) * int(m.group(2)), text)
    return text.split("|")


def layout_string(counts: list[int], mtp_layers: int) -> str:
    """The layout string of decoder-layer counts per stage (MTP and the loss after the last stage)."""
    stages = []
    for i, n in enumerate(counts):
        stage = ("E" if i == 0 else "") + "t" * n
        if i == len(counts) - 1:
            stage += "m" * mtp_layers + "L"
        stages.append(stage)
    return "|".join(stages)


def resolve(num_layers: int, mtp_layers: int, pipeline: int, virtual_pipeline: int | None,
            layout: list[int] | str | None) -> tuple[str | None, int]:
    """(layout string for megatron-core or None for its even split, chunks per pipeline rank)."""
    where = "parallel.pipeline_layout"
    if layout is None:
        vpp = virtual_pipeline or 1
        if num_layers % (pipeline * vpp):
            what = f"parallel.pipeline × parallel.virtual_pipeline = {pipeline}×{vpp}" if vpp > 1 else \
                f"parallel.pipeline={pipeline}"
            raise UserError(f"model.num_layers={num_layers} cannot be split evenly over {what} stages (MTP layers "
                            "sit on the last stage in addition); change the sizes or set parallel.pipeline_layout")
        return None, vpp
    if isinstance(layout, str):
        stages = unroll(layout)
        bad = sorted(set("".join(stages)) - set("EtmL"))
        if bad:
            raise UserError(f"{where} '{layout}' has characters {''.join(bad)!r}; use E (embedding), t (decoder "
                            "layer), m (MTP layer), L (loss), | (stage boundary) and (..)*n")
        text = layout
    else:
        if any(n < 0 for n in layout) or sum(layout) != num_layers:
            raise UserError(f"{where} {layout} must be non-negative counts summing to model.num_layers={num_layers} "
                            "(MTP layers are added to the last stage)")
        text = layout_string(list(layout), mtp_layers)
        stages = unroll(text)
    if len(stages) % pipeline:
        raise UserError(f"{where} has {len(stages)} stages but parallel.pipeline is {pipeline}; give "
                        f"pipeline × virtual_pipeline stages (a multiple of {pipeline})")
    vpp = len(stages) // pipeline
    if virtual_pipeline not in (None, vpp):
        raise UserError(f"{where} has {len(stages)} stages = parallel.pipeline {pipeline} × {vpp}, but "
                        f"parallel.virtual_pipeline is {virtual_pipeline}; make them agree or set it to null")
    return text, vpp


def stages(num_layers: int, mtp_layers: int, pipeline: int, virtual_pipeline: int | None,
           layout: list[int] | str | None) -> list[Stage]:
    """Every stage in megatron-core's order (stage i: pipeline rank i % PP, chunk i // PP), checked."""
    text, vpp = resolve(num_layers, mtp_layers, pipeline, virtual_pipeline, layout)
    if text is None:
        per = num_layers // (pipeline * vpp)
        text = layout_string([per] * (pipeline * vpp), mtp_layers)
    where = f"parallel.pipeline_layout '{text}'"
    result, next_layer = [], 0
    for i, stage in enumerate(unroll(text)):
        n = stage.count("t")
        result.append(Stage(i % pipeline, i // pipeline, tuple(range(next_layer, next_layer + n)),
                            "E" in stage, stage.count("m"), "L" in stage))
        next_layer += n
    flat = "".join(unroll(text))
    if not flat.startswith("E") or flat.count("E") != 1:
        raise UserError(f"{where} must start with the embedding E, exactly once")
    if not flat.endswith("L") or flat.count("L") != 1:
        raise UserError(f"{where} must end with the loss L, exactly once")
    if flat.count("t") != num_layers:
        raise UserError(f"{where} places {flat.count('t')} decoder layers but model.num_layers is {num_layers}")
    if flat.count("m") != mtp_layers:
        raise UserError(f"{where} places {flat.count('m')} MTP layers but mtp.num_layers is {mtp_layers}")
    if mtp_layers and (result[-1].mtp_layers != mtp_layers or "t" in flat[flat.index("m"):]):
        raise UserError(f"{where} must put all MTP layers after the last decoder layer, on the last stage (last "
                        "pipeline rank, last virtual chunk), next to the loss")
    for stage in result:
        if not (stage.layers or stage.embedding or stage.mtp_layers or stage.loss):
            raise UserError(f"{where} leaves pipeline rank {stage.pp_rank} (chunk {stage.vp_stage}) with nothing to "
                            "run; give every stage at least one layer")
    return result
