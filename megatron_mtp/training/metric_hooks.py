"""Attach the metric collectors (metrics.py) to a rank's model chunks."""

from __future__ import annotations

from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.models.tensor_table import drafter_output_layers
from megatron_mtp.training.components import unwrap
from megatron_mtp.training.metrics import MTPMetrics
from megatron_mtp.training.moe_metrics import ExpertLoad


def attach_metrics(model_chunks: list, cfg, ranks) -> tuple[MTPMetrics | None, ExpertLoad]:
    """MTP acceptance on the chunk that holds the output layer (the last chunk of the last pipeline
    rank); expert loads and biases from every router of every chunk."""
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router import Router

    metrics = None
    last = unwrap(model_chunks[-1])
    if ranks.is_last_stage and cfg.mtp.num_layers > 0:
        cp_group = parallel_state.get_context_parallel_group() if ranks.cp > 1 else None
        metrics = MTPMetrics(cfg.mtp.num_layers, parallel_state.get_tensor_model_parallel_group(), cp_group)
        # no logits are made (the chunked loss), or the style's model reports its drafts itself: it hands the argmaxes
        if getattr(last, "output_chunk", None) or get_style(cfg.mtp.style).observes_predictions:
            last.prediction_observer = metrics
        else:
            last.output_layer.register_forward_hook(metrics.output_hook)
        modules = dict(last.named_modules())
        for name in drafter_output_layers():  # a separate drafter's steps, before the main logits
            if name in modules:
                modules[name].register_forward_hook(metrics.output_hook)
    total_layers = cfg.model.num_layers + cfg.mtp.num_layers
    m = cfg.model
    load = ExpertLoad(total_layers, m.num_experts, m.router_topk, m.moe_pad_to_capacity, m.router_enable_expert_bias)
    for chunk in model_chunks:
        for name, module in unwrap(chunk).named_modules():
            if isinstance(module, Router):
                index = _global_layer_index(name, module, cfg)
                module.register_forward_hook(load.hook_for(index))
                load.watch_bias(index, module)
    return metrics, load


def _global_layer_index(name: str, router, cfg) -> int:
    # decoder layers know their global 1-based layer_number; MTP layers are numbered after them
    if name.startswith("mtp."):
        return cfg.model.num_layers + int(name.split(".")[2])
    return router.layer_number - 1 if getattr(router, "layer_number", None) else 0
