"""The DeepSeek-V3.2 training stages (``model.dsa_stage``) and how a dense MLA checkpoint grows a DSA model.

Design note. The DeepSeek-V3.2-Exp report trains DSA from a dense (MLA) checkpoint in two stages:

- warmup: the attention stays dense and every weight is frozen but the lightning indexers (the MTP layer's
  too), which learn from their KL loss towards the main attention's distribution, summed over heads.
  megatron-core 0.19's DSAttention has no dense switch; it selects ``min(dsa_indexer_topk, keys)`` tokens,
  and a causal mask turns the selected future ones into -1 (no key), so a top-k of at least the sequence
  length selects every earlier token: the attention is dense, and the indexer loss over the selected
  tokens is the dense KL (``dsa_indexer_use_sparse_loss`` off). The model's own ``index_topk`` stays what
  it is (the checkpoint and an export keep it). The freeze is frozen_base's (models/frozen_base.py):
  ``requires_grad`` off outside the indexers, so megatron-core's DDP and optimizer hold the indexers
  alone; unlike mtp.freeze_base the forward keeps gradients on, since DSAttention computes its indexer
  loss only then (its input is detached, so nothing else takes a gradient). The routers' expert bias,
  a buffer megatron-core updates after each step, is frozen too (its ``frozen_expert_bias``).
- sparse: top-k selection on, every weight trains, the indexer's input detached (megatron-core does that)
  and its KL loss over the selected tokens only (``dsa_indexer_use_sparse_loss``).

Growing from a dense checkpoint (checkpoint.load of a ``GROWS_FROM`` family's run or import): every tensor
but the indexers' is the checkpoint's, under its name there: DSA keeps MLA's q/kv latent norms apart from
the up-projections, which the MLA families' checkpoints hold under the TE spelling (``LATENT_NORMS``). The
indexers keep their initial weights; any other missing or unexpected tensor stays an error
(training/checkpoint_state.py).
"""

from __future__ import annotations

from typing import Any

from megatron_mtp.config.model import Growth
from megatron_mtp.errors import UserError

STAGES = ("warmup", "sparse")

INDEXER = ".indexer."
"""What every lightning-indexer parameter's name and checkpoint key hold (``core_attention.indexer.``)."""

LATENT_NORMS = {
    "self_attention.q_layernorm.weight": "self_attention.linear_q_up_proj.layer_norm_weight",
    "self_attention.kv_layernorm.weight": "self_attention.linear_kv_up_proj.layer_norm_weight",
}
"""A DSA layer's key -> the dense MLA checkpoint's key of the same tensor (within a layer)."""


def is_indexer(name: str) -> bool:
    return INDEXER in name


def dense_checkpoint_key(key: str) -> str:
    """The key under which a dense MLA checkpoint holds the tensor a DSA model names ``key``."""
    for ours, theirs in LATENT_NORMS.items():
        if key.endswith(ours):
            return key[: -len(ours)] + theirs
    return key


GROWTH = Growth(fresh=is_indexer, checkpoint_key=dense_checkpoint_key)
"""How a DSA model takes a dense MLA family's checkpoint (DSAModelConfig.grows_from)."""


def stage_transformer_kwargs(cfg: Any) -> dict:
    """megatron-core's DSA fields for ``model.dsa_stage`` (nothing without one: megatron-core's defaults)."""
    stage = cfg.model.dsa_stage
    if stage == "warmup":
        return dict(dsa_indexer_topk=max(cfg.model.index_topk, cfg.training.seq_length),
                    dsa_indexer_use_sparse_loss=False)
    if stage == "sparse":
        return dict(dsa_indexer_use_sparse_loss=True)
    return {}


def freeze_for_stage(model, model_config) -> None:
    """In the warm-up, freeze every parameter of ``model`` (one pipeline stage's GPTModel) but the indexers'
    (``model_config.trains``) and the routers' expert bias."""
    if model_config.dsa_stage != "warmup":
        return
    for name, param in model.named_parameters():
        param.requires_grad_(model_config.trains(name))
    for module in model.modules():
        if hasattr(module, "expert_bias"):
            module.frozen_expert_bias = True


def check_stage(cfg: Any) -> None:
    """One sentence for a stage the rest of the run config cannot take."""
    m = cfg.model
    if m.dsa_stage is None:
        return
    if m.indexer_loss_coeff <= 0:
        raise UserError(f"model.dsa_stage={m.dsa_stage} trains the indexers with their KL loss, but "
                        "model.indexer_loss_coeff is 0; set it above 0 (the recipe takes 0.01)")
    if m.dsa_stage == "warmup" and cfg.mtp.freeze_base:
        raise UserError("model.dsa_stage=warmup trains the indexers alone, and mtp.freeze_base the MTP part alone; "
                        "drop mtp.freeze_base")
