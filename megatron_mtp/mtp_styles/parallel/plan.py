"""What ``plan`` counts of parallel MTP heads: their parameters (registered after GPTModel's own modules), their
saved activations (none held past the forward head by head, the parameter gradients instead) and its sentence."""

from __future__ import annotations

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


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, act.Saved]]:
    """Each head's norm and layer (never under full recompute: mods is empty then); head by head, the gradients
    of the heads' and output layer's parameters instead."""
    if cfg.mtp.head_by_head_backward:
        return [("mtp_heads.", act.head_by_head_held(d, head_grad_bytes))] if stage.mtp_layers else []
    out = []
    for _ in range(stage.mtp_layers):
        out.append(("mtp_heads.", act.parallel_head(d, k)))
        out.append(("mtp_heads.", act.decoder_layer(d, k, mods, mtp_is_moe(cfg.model), grouped_gemm)))
    return out


def assumption(cfg):
    return (f"MTP: {cfg.mtp.num_layers} parallel heads on the loss stage, no embedding copy there" + (
        "; head by head: each head's graph freed in the forward, its parameter gradients (and the output "
        "layer's) held per micro-batch instead" if cfg.mtp.head_by_head_backward else ""))
