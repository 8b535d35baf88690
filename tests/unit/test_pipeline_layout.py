"""Layer placement on pipeline stages: our stages agree with megatron-core's own layout parser."""

from __future__ import annotations

import pytest

from megatron_mtp.config import load_config, pipeline_layout
from megatron_mtp.config.validate import validate
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.transformer_config import megatron_layout

CASES = [
    # (num_layers, mtp, pp, vpp, layout)
    (4, 1, 2, None, None),
    (4, 1, 2, 2, None),
    (4, 1, 2, None, [3, 1]),
    (4, 1, 2, None, [4, 0]),
    (4, 1, 2, None, "Et|t|t|tmL"),
    (8, 2, 2, None, [1, 2, 3, 2]),
    (61, 1, 8, None, "Et|(tt|)*30mL"),
    (61, 1, 16, None, "Etttt|(tttt|)*14tmL"),
]


@pytest.mark.parametrize("num_layers, mtp, pp, vpp, layout", CASES)
def test_stages_agree_with_megatron_core(num_layers, mtp, pp, vpp, layout):
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

    ours = pipeline_layout.stages(num_layers, mtp, pp, vpp, layout)
    text, chunks = pipeline_layout.resolve(num_layers, mtp, pp, vpp, layout)
    if text is None:
        text = pipeline_layout.layout_string([num_layers // (pp * chunks)] * (pp * chunks), mtp)
    theirs = PipelineParallelLayerLayout(text, pp)
    theirs.validate_layer_layout(num_layers, mtp)
    assert theirs.virtual_pipeline_model_parallel_size == chunks == len(ours) // pp
    # megatron-core numbers decoder layers chunk by chunk, rank by rank (its flatten_layout order)
    first_ids, next_id = {}, 0
    for vp in range(chunks):
        for rank in range(pp):
            first_ids[(rank, vp)] = next_id
            next_id += theirs.layout[rank][vp].count(LayerType.decoder)
    for stage in ours:
        row = theirs.layout[stage.pp_rank][stage.vp_stage]
        start = first_ids[(stage.pp_rank, stage.vp_stage)]
        assert stage.layers == tuple(range(start, start + row.count(LayerType.decoder)))
        assert row.count(LayerType.mtp) == stage.mtp_layers
        assert (LayerType.embedding in row) == stage.embedding and (LayerType.loss in row) == stage.loss
    assert ours[-1].pp_rank == pp - 1 and ours[-1].mtp_layers == mtp and ours[-1].loss


def test_megatron_layout_is_passed_whenever_there_are_stages():
    cfg = load_config(None, ["model.num_layers=4", "parallel.pipeline=2", "parallel.virtual_pipeline=2"])
    assert megatron_layout(cfg) == ("Et|t|t|tmL", 2)
    assert megatron_layout(load_config(None, [])) == (None, 1)


@pytest.mark.parametrize("overrides, message", [
    (["parallel.pipeline=2", "parallel.pipeline_layout=Et|t|tmL"], "has 3 stages but parallel.pipeline is 2"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=Et|tttmX"], "has characters 'X'"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=tE|tttmL"], "must start with the embedding"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=Ettm|ttL"], "after the last decoder layer"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=Ett|ttmL", "parallel.virtual_pipeline=2"],
     "parallel.virtual_pipeline is 2"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=Ettt|tmL", "mtp.num_layers=0"], "places 1 MTP layers"),
    (["parallel.pipeline=2", "parallel.pipeline_layout=[4,0]", "mtp.num_layers=0"],
     None),  # "Etttt|L": a last stage with only the loss is valid
    (["parallel.pipeline=2", "parallel.pipeline_layout=[3,-1,2]"], "non-negative counts"),
    (["parallel.pipeline=1", "parallel.virtual_pipeline=2"], "needs parallel.pipeline > 1"),
    (["parallel.pipeline=2", "parallel.virtual_pipeline=2", "training.global_batch_size=12",
      "training.micro_batch_size=4"], "multiple of parallel.pipeline=2"),
])
def test_bad_placements_are_one_sentence(overrides, message):
    cfg = load_config(None, ["model.num_layers=4", *overrides])
    if message is None:
        validate(cfg, 2)
        return
    with pytest.raises(UserError, match=message) as info:
        validate(cfg, 2)
    assert "\n" not in str(info.value)
