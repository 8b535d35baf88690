"""What one micro-batch leaves saved on a pipeline chunk until its backward (plan/memory.py adds it up over the
micro-batches the schedule holds in flight): the embedding, each decoder layer (or its full-recompute checkpoint),
the MTP style's part (its ``plan`` module's ``saved``), the final norm, the output layer and its loss."""

from __future__ import annotations

from dataclasses import replace

from megatron_mtp.config import pipeline_layout
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.config.parallel_sizes import ParallelSizes
from megatron_mtp.config.root import Config
from megatron_mtp.models.tensor_table import is_moe_layer
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.params import BYTES, has_final_norm


def recompute_modules(cfg: Config) -> frozenset:
    r = cfg.recompute
    return frozenset(r.modules) if r.granularity == "selective" else frozenset()



def chunk_activations(cfg: Config, stage: pipeline_layout.Stage, d: act.Dims, k: act.Kernels,
                      grouped_gemm: bool, head_grad_bytes: float = 0.0) -> act.Saved:
    """Bytes one micro-batch leaves saved on a chunk until its backward (`head_grad_bytes`: with
    mtp.head_by_head_backward, the gradients of the heads' and output layer's parameters)."""
    r, mods = cfg.recompute, recompute_modules(cfg)
    out = act.Saved()
    frozen = cfg.mtp.freeze_base  # the main model runs under no_grad: it saves nothing

    def merge(prefix: str, saved: act.Saved) -> None:
        for name, nbytes in saved.items.items():
            out.add(f"{prefix}{name}", nbytes)

    if stage.embedding and not frozen:
        merge("", act.embedding(d))
    for j, layer in enumerate([] if frozen else stage.layers):
        moe = is_moe_layer(cfg.model, layer)
        kind = "moe" if moe else "dense"
        if r.granularity == "full" and (j < r.num_layers if r.method == "block" else True):
            if r.method == "block" or j % r.num_layers == 0:
                merge(f"{kind}_layers.", act.full_recompute_layer(d))
            continue
        merge(f"{kind}_layers.", act.decoder_layer(act.layer_dims(cfg, d, layer), k, mods, moe, grouped_gemm))
    style = get_style(cfg.mtp.style)
    head_by_head = cfg.mtp.head_by_head_backward and style.head_by_head
    if cfg.mtp.num_layers:  # the style's MTP part
        for prefix, saved in style.plan().saved(cfg, stage, d, k, mods, grouped_gemm, head_grad_bytes):
            merge(prefix, saved)
    if has_final_norm(cfg, stage, stage.loss) and not frozen:
        merge("", act.final_norm(d, k))
    if stage.loss:  # head by head: the heads' logits are freed in the forward
        heads = bool(stage.mtp_layers) and not style.chains_modules and not head_by_head
        logits = replace(d, softcap=False) if style.separate_drafter else d  # its own logits are not capped
        merge("", act.output_and_loss(logits, k, 0 if head_by_head else cfg.mtp.num_layers, main=not frozen,
                                      soft=cfg.mtp.targets != "tokens",
                                      trunk_saved=heads and act.heads_share_trunk(d, k)))
    if not stage.embedding and k.norm == "torch" and d.act_bytes != act.FP32 and not frozen:
        out.add("pipeline.input", d.hidden * d.local * d.act_bytes)  # held by the schedule, not by the norm
    return out



def head_grad_bytes(cfg: Config, sizes: ParallelSizes, stage: pipeline_layout.Stage, vocab: int, te: bool) -> float:
    """With mtp.head_by_head_backward: the parameter gradients a micro-batch holds on the heads' stage."""
    style = get_style(cfg.mtp.style)
    if not (cfg.mtp.head_by_head_backward and stage.mtp_layers and style.head_by_head):
        return 0.0
    heads = sum(p.numel for p in style.plan().params(cfg, sizes, stage, vocab, te))
    return (heads + vocab // sizes.tp * cfg.model.hidden_size) * BYTES[cfg.training.precision]
