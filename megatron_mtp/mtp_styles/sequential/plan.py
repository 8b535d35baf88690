"""What ``plan`` counts of sequential MTP modules beyond the GPTModel's own walk (plan/params.py registers their
parameters in place, after the decoder's final norm: they are megatron-core's own MTP block): what each module
saves for the backward around its layer (``mtp_wrapper``) and its sentence."""

from __future__ import annotations

from megatron_mtp.models.saved_activations import Dims, Kernels, Saved, linear_input, norm
from megatron_mtp.models.tensor_table import mtp_is_moe
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.speculative import draft_step_bytes  # noqa: F401  (one draft step: the module's layer)


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list:
    """None after GPTModel's own modules: the block's parameters are in the GPTModel's order (plan/params.py)."""
    return []


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, Saved]]:
    """Each module's wrapper (its norms and eh_proj input) and its layer, unless full recompute takes the module."""
    full = cfg.recompute.granularity == "full" and cfg.recompute.method == "uniform"
    out = []
    for _ in range(stage.mtp_layers):
        out.append(("mtp.", mtp_wrapper(d, k, full)))
        if not full:
            layer = act.layer_dims(cfg, d, None)
            out.append(("mtp.", act.decoder_layer(layer, k, mods, mtp_is_moe(cfg.model), grouped_gemm)))
    return out


def mtp_wrapper(d: Dims, k: Kernels, full_recompute: bool) -> Saved:
    """An MTP layer's own tensors around its transformer layer: embedding lookup, enorm and hnorm,
    the eh_proj input [embedding; hidden], its final norm."""
    out, n = Saved(), d.local
    out.add("mtp.token_ids", d.tokens * 8)
    if full_recompute:  # the checkpoint keeps its hidden-state and embedding inputs
        out.add("mtp.inputs", 2 * d.hidden * n * d.act_bytes)
        return out
    norm(out, "mtp.enorm", d.hidden, n, d, k)
    norm(out, "mtp.hnorm", d.hidden, n, d, k)
    out.add("mtp.eh_proj_input", 2 * d.hidden * n * linear_input(d, k))
    norm(out, "mtp.final_norm", d.hidden, n, d, k)
    return out


def assumption(cfg):
    """The plan's sentence about the MTP part (None: nothing beyond the GPTModel's own)."""
    if cfg.mtp.repeated_layer:
        return (f"mtp.repeated_layer: one MTP module applied {cfg.mtp.num_layers} times: its weights, gradients "
                f"and optimizer state counted once, its activations {cfg.mtp.num_layers} times")
    return None
