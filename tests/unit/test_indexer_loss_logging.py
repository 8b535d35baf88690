"""The DSA indexer loss scalars: per layer, the MTP layers' apart from the decoder layer of the same number
(megatron-core's tracker adds them there), and the headline mean over the decoder layers that have an indexer."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.platform.megatron_core import MTPIndexerLoss
from megatron_mtp.training.interval import indexer_loss_values


def test_per_layer_values_and_the_mean_over_decoder_layers_with_an_indexer():
    # 4 decoder layers (layer 2 reuses layer 1's top-k: no indexer, no count), then 1 MTP layer; counts of 2:
    # two replicas (or two steps) each added the layer's value
    sums = torch.tensor([1.0, 0.0, 3.0, 5.0, 40.0], dtype=torch.float64)
    counts = torch.tensor([2.0, 0.0, 2.0, 2.0, 2.0], dtype=torch.float64)
    values = indexer_loss_values(torch.stack([sums, counts]), num_layers=4)
    assert values == {"train/indexer_loss": pytest.approx((0.5 + 1.5 + 2.5) / 3),
                      "train/indexer_loss/layer_01": 0.5, "train/indexer_loss/layer_03": 1.5,
                      "train/indexer_loss/layer_04": 2.5, "train/indexer_loss/layer_05": 20.0}


def test_nothing_is_logged_where_no_layer_counted():
    assert indexer_loss_values(torch.zeros(2, 5, dtype=torch.float64), num_layers=4) == {}


def test_the_mtp_layers_loss_is_moved_out_of_the_decoder_layer_of_its_number(monkeypatch):
    tracker = {}  # megatron-core's [num_layers] tensor, made at the first save (as save_loss_to_tracker does)
    monkeypatch.setattr(MTPIndexerLoss, "_tracked", staticmethod(lambda: tracker.get("values")))
    separate = MTPIndexerLoss(depth=2)
    before_1, after_1 = separate._pre_hook(0, 1), separate._hook(0, 1)  # MTP depth 1 numbers its layer 1
    before_2, after_2 = separate._pre_hook(1, 2), separate._hook(1, 2)
    before_1(None, ())
    tracker["values"] = torch.tensor([0.25, 0.0, 0.0])  # the MTP layer's forward was the tracker's first save
    after_1(None, (), None)
    assert tracker["values"].tolist() == [0.0, 0.0, 0.0] and separate.values.tolist() == [0.25, 0.0]
    tracker["values"] += torch.tensor([2.0, 3.0, 4.0])  # the next micro-batch's decoder layers
    before_1(None, ())
    tracker["values"][0] += 0.5
    after_1(None, (), None)
    before_2(None, ())
    tracker["values"][1] += 0.125
    after_2(None, (), None)
    assert tracker["values"].tolist() == [2.0, 3.0, 4.0] and separate.values.tolist() == [0.75, 0.125]
    separate.clear()
    assert separate.values.tolist() == [0.0, 0.0]
