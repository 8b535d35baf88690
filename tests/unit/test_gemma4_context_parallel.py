"""Gemma 4 under context parallelism: the sliding-window layers' core attention is asked for Transformer Engine's
all-to-all (its default ring refuses a window; models/gemma4/specs.py), the full layers' keeps what megatron-core's
TransformerLayer hands every attention. Built from the family's own layer specs and TransformerConfig in one
process, with the projections, norms and core attention recording what they are built with."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.config.validate import validate
from megatron_mtp.models.family import get_family

pytestmark = pytest.mark.mcore

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "gemma4_tiny_cpu.yaml")


class _Built(torch.nn.Module):
    """A stand-in submodule that keeps the keyword arguments it was built with."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.kwargs = kwargs


class _Core(_Built):
    """The core attention's stand-in: the arguments must also bind to the CPU attention megatron-mtp builds."""

    def __init__(self, **kwargs):
        from megatron_mtp.platform.local_modules import CoreAttention

        inspect.signature(CoreAttention.__init__).bind(None, **kwargs)
        super().__init__(**kwargs)


def _core_attention_kwargs(cfg, layer_cp_comm_type=None) -> dict:
    """kind -> the keyword arguments each layer kind's core attention gets (``layer_cp_comm_type``: what
    TransformerLayer passes the attention when the TransformerConfig sets cp_comm_type)."""
    from megatron.core.transformer.spec_utils import build_module

    from megatron_mtp.models.gemma4.attention import Gemma4AttentionSubmodules
    from megatron_mtp.models.gemma4.specs import layer_spec
    from megatron_mtp.platform import Platform

    platform = Platform(device="cpu", backend="gloo", use_te=False)
    config = get_family("gemma4").build_transformer_config(cfg, platform)
    assert config.context_parallel_size == cfg.parallel.context
    parts = Gemma4AttentionSubmodules(linear_q=_Built, linear_k=_Built, linear_v=_Built, linear_proj=_Built,
                                      core_attention=_Core, q_layernorm=_Built, k_layernorm=_Built,
                                      post_layernorm=_Built)
    tp = SimpleNamespace(tp=SimpleNamespace(size=lambda: 1))
    extra = {} if layer_cp_comm_type is None else {"cp_comm_type": layer_cp_comm_type}
    out = {}
    for kind in ("sliding_attention", "full_attention"):
        spec = dataclasses.replace(layer_spec(cfg, platform, kind).submodules.self_attention, submodules=parts)
        attention = build_module(spec, config=config, layer_number=1, pg_collection=tp, **extra)
        out[kind] = attention.core_attention.kwargs
    return out


def test_sliding_layers_ask_for_the_all_to_all_under_context_parallelism():
    cfg = load_config(TINY, ["parallel.context=2", "parallel.world_size=2", "model.vocab_size=256"])
    validate(cfg)
    built = _core_attention_kwargs(cfg)
    assert built["sliding_attention"]["cp_comm_type"] == "a2a"  # Transformer Engine takes a window with a2a
    assert built["sliding_attention"]["config"].window_size == (cfg.model.sliding_window - 1, 0)
    assert "cp_comm_type" not in built["full_attention"]  # TE's default (its ring) for the full layers
    assert built["full_attention"]["config"].window_size is None
    # a cp_comm_type the TransformerConfig sets reaches the full layers; the sliding ones keep the all-to-all
    built = _core_attention_kwargs(cfg, layer_cp_comm_type="p2p")
    assert built["full_attention"]["cp_comm_type"] == "p2p" and built["sliding_attention"]["cp_comm_type"] == "a2a"


def test_without_context_parallelism_every_layer_keeps_the_default():
    built = _core_attention_kwargs(load_config(TINY, ["model.vocab_size=256"]))
    assert all("cp_comm_type" not in kwargs for kwargs in built.values()), built
