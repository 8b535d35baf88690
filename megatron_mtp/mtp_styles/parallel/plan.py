"""What ``plan`` counts of parallel MTP heads: their parameters (registered after GPTModel's own modules), their
saved activations (none held past the forward head by head, the parameter gradients instead) and its sentence."""

from __future__ import annotations

from megatron_mtp.models.saved_activations import Dims, Kernels, Saved, norm
from megatron_mtp.models.tensor_table import HEAD_NORM, mtp_is_moe
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.params import Param, layer_params, rule_param
from megatron_mtp.platform.megatron_core import MTP_LAYER_ATTR


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list[Param]:
    """Parameters of the stage's heads (mtp.style=parallel): a layer and a norm each."""
    out: list[Param] = []
    for i in range(stage.mtp_layers):
        p = f"mtp_heads.layers.{i}."
        out += layer_params(cfg, sizes, f"{p}{MTP_LAYER_ATTR}.", mtp_is_moe(cfg.model), te)
        out.append(rule_param(cfg, sizes, p, HEAD_NORM, te))
    return out


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, Saved]]:
    """Each head's norm and layer (never under full recompute: mods is empty then); head by head, the gradients
    of the heads' and output layer's parameters instead."""
    if cfg.mtp.head_by_head_backward:
        return [("mtp_heads.", head_by_head_held(d, head_grad_bytes))] if stage.mtp_layers else []
    out = []
    for _ in range(stage.mtp_layers):
        out.append(("mtp_heads.", parallel_head(d, k)))
        out.append(("mtp_heads.", act.decoder_layer(d, k, mods, mtp_is_moe(cfg.model), grouped_gemm)))
    return out


def parallel_head(d: Dims, k: Kernels) -> Saved:
    """A parallel MTP head's own tensor around its transformer layer: its final norm (the layer's
    input is the trunk output, which the main output layer saves too)."""
    out = Saved()
    norm(out, "head.final_norm", d.hidden, d.local, d, k)
    return out


def head_by_head_held(d: Dims, head_grad_bytes: float) -> Saved:
    """mtp.head_by_head_backward: what a micro-batch holds from the forward to its backward instead
    of the heads' activations: the trunk-output gradient and the gradients of the heads' and the
    output layer's parameters (taken in the forward)."""
    out = Saved()
    out.add("heads.trunk_grad", d.hidden * d.local * d.act_bytes)
    out.add("heads.parameter_grads", head_grad_bytes)
    return out


def assumption(cfg):
    return (f"MTP: {cfg.mtp.num_layers} parallel heads on the loss stage, no embedding copy there" + (
        "; head by head: each head's graph freed in the forward, its parameter gradients (and the output "
        "layer's) held per micro-batch instead" if cfg.mtp.head_by_head_backward else ""))
