"""What ``plan`` counts of sequential MTP modules beyond the GPTModel's own walk (plan/params.py registers their
parameters in place, after the decoder's final norm: they are megatron-core's own MTP block)."""

from __future__ import annotations

from megatron_mtp.models.tensor_table import mtp_is_moe
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.speculative import draft_step_bytes  # noqa: F401  (one draft step: the module's layer)


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list:
    """None after GPTModel's own modules: the block's parameters are in the GPTModel's order (plan/params.py)."""
    return []


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, act.Saved]]:
    """Each module's wrapper (its norms and eh_proj input) and its layer, unless full recompute takes the module."""
    full = cfg.recompute.granularity == "full" and cfg.recompute.method == "uniform"
    out = []
    for _ in range(stage.mtp_layers):
        out.append(("mtp.", act.mtp_wrapper(d, k, full)))
        if not full:
            layer = act.layer_dims(cfg, d, None)
            out.append(("mtp.", act.decoder_layer(layer, k, mods, mtp_is_moe(cfg.model), grouped_gemm)))
    return out


def assumption(cfg):
    """The plan's sentence about the MTP part (None: nothing beyond the GPTModel's own)."""
    if cfg.mtp.repeated_layer:
        return (f"mtp.repeated_layer: one MTP module applied {cfg.mtp.num_layers} times: its weights, gradients "
                f"and optimizer state counted once, its activations {cfg.mtp.num_layers} times")
    return None
