"""Attach the metric collectors (metrics.py) to a stage's model."""

from __future__ import annotations

from megatron_mtp.training.metrics import ExpertLoad, MTPMetrics
from megatron_mtp.training.setup import unwrap


def attach_metrics(model_chunk, cfg, ranks) -> tuple[MTPMetrics | None, ExpertLoad]:
    from megatron.core import parallel_state
    from megatron.core.transformer.moe.router import Router

    gpt = unwrap(model_chunk)
    metrics = None
    if ranks.is_last_stage and cfg.mtp.num_layers > 0:
        metrics = MTPMetrics(cfg.mtp.num_layers, parallel_state.get_tensor_model_parallel_group())
        gpt.output_layer.register_forward_hook(metrics.output_hook)
    total_layers = cfg.model.num_layers + cfg.mtp.num_layers
    load = ExpertLoad(total_layers, cfg.model.num_experts)
    for name, module in gpt.named_modules():
        if isinstance(module, Router):
            load_index = _global_layer_index(name, module, cfg)
            module.register_forward_hook(load.hook_for(load_index))
    return metrics, load


def _global_layer_index(name: str, router, cfg) -> int:
    # decoder layers know their global 1-based layer_number; MTP layers are numbered after them
    if name.startswith("mtp."):
        return cfg.model.num_layers + int(name.split(".")[2])
    return router.layer_number - 1 if getattr(router, "layer_number", None) else 0
