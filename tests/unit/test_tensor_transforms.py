"""The tensor rules' transforms (models/tensor_transforms.py): each cuts a megatron-core tensor into the rows its
``part_rows`` says and joins them back to the same tensor; a row names as many HF tensors as its transform makes."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.models.tensor_table import Param
from megatron_mtp.models.tensor_transforms import (
    GATED,
    Copy,
    Direct,
    Fp32,
    GatedFusion,
    Int64,
    QKVFusion,
    StackedExperts,
)


@pytest.mark.parametrize("transform, rows", [(Direct(), 6), (Copy(), 6), (Fp32(), 6), (Int64(), 6),
                                             (StackedExperts(), 6), (GatedFusion(), 6), (QKVFusion(2, 2, 3), 24)])
def test_from_hf_inverts_to_hf_in_the_rows_part_rows_says(transform, rows):
    tensor = torch.arange(rows * 5, dtype=torch.float32).reshape(rows, 5)
    parts = transform.to_hf(tensor)
    assert len(parts) == transform.parts and [p.shape[0] for p in parts] == transform.part_rows(rows)
    assert torch.equal(transform.from_hf(parts), tensor)


def test_the_stored_dtypes_and_the_qkv_layout_of_a_model():
    export = torch.bfloat16
    assert (Direct().dtype(export), Fp32().dtype(export), Int64().dtype(export)) == (export, torch.float32,
                                                                                    torch.int64)
    rule = QKVFusion(layout=lambda m: (m, 4, 8))
    assert rule.for_model(2) == QKVFusion(2, 4, 8) and rule.for_model(2).part_rows(96) == [64, 16, 16]
    assert not StackedExperts().per_expert and GatedFusion().per_expert and QKVFusion().interleaved


def test_a_row_names_as_many_hf_tensors_as_its_transform_makes():
    with pytest.raises(ValueError, match="GatedFusion makes 2 HF tensor"):
        Param("mlp.linear_fc1.weight", ("mlp.gate_proj.weight",), "main", transform=GATED)
    with pytest.raises(ValueError, match="Direct makes 1 HF tensor"):
        Param("mlp.linear_fc1.weight", ("mlp.gate_proj.weight", "mlp.up_proj.weight"), "main")
    assert Param("x.weight", ("a", "b"), "main", num_experts=4, transform=GATED).per_expert
