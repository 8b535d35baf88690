"""The options of a separate drafter model (``mtp.style: assistant``; Gemma 4's assistant,
models/gemma4/assistant/), the config section ``mtp.assistant`` (the style's ``options``; config/model.py
``mtp_config_class``): its own width and layers, reading the target's stored keys and values, and the checks every
family's assistant needs. No torch: reading a config imports this module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron_mtp.errors import UserError


@dataclass
class AssistantOptions:
    """``mtp.assistant``: the assistant's shape (mtp.style assistant; mtp.num_layers is its draft steps)."""

    hidden_size: int = 256
    """The assistant's own width (the 26B-A4B release's assistant: 1,024 beside the target's 2,816)."""
    num_layers: int = 4
    """Its decoder layers, each with query-only attention over the target's keys and values."""
    num_attention_heads: int = 4
    """Its query heads per layer; their widths are those of the target's layers of the same kind."""
    ffn_hidden_size: int = 1024
    """Width of its dense GELU-tanh MLP (HF intermediate_size)."""
    layer_types: Optional[list[str]] = None
    """Each layer's attention, sliding_attention or full_attention: which of the target's stored layers it
    reads (the last of that kind). null: every layer sliding but the last, which is full."""
    num_centroids: int = 0
    """> 0: a centroid-masked output (transformers' use_ordered_embeddings): drafting scores this many clusters
    of vocabulary / num_centroids tokens and takes its logits only over the tokens of the best centroid_top_k of
    them; training adds the centroid cross entropy to each step's loss (models/gemma4/assistant/centroids.py).
    0: the whole output table (the 26B-A4B and 31B releases)."""
    centroid_top_k: int = 32
    """With num_centroids: the clusters whose tokens a draft step scores (the releases: 32 of 2,048)."""
    step_weights: Optional[list[float]] = None
    """Weight of each draft step's loss (mtp.num_layers entries): the objective is
    lm + (λ/K)·Σ_k w_k·loss_k. null: 1 each."""

    def kinds(self) -> list[str]:
        """The attention kind of each assistant layer."""
        if self.layer_types is not None:
            return list(self.layer_types)
        return ["sliding_attention"] * (self.num_layers - 1) + ["full_attention"] * min(self.num_layers, 1)


def check_assistant(cfg) -> None:
    """What a separate drafter (mtp.style assistant) of a run config needs of any family, one sentence for the first
    it lacks (config/validate.py calls it); the family checks the rest (models/gemma4/model_config.py)."""
    mtp, a = cfg.mtp, cfg.mtp.assistant
    if not mtp.freeze_base:
        raise UserError("mtp.freeze_base=false does not work with mtp.style=assistant, which always trains a drafter "
                        "beside a frozen target (the target in checkpoint.load); drop mtp.freeze_base")
    for name in ("hidden_size", "num_layers", "num_attention_heads", "ffn_hidden_size"):
        if getattr(a, name) < 1:
            raise UserError(f"mtp.assistant.{name} is {getattr(a, name)}; set a positive number")
    if a.layer_types is not None and len(a.layer_types) != a.num_layers:
        raise UserError(f"mtp.assistant.layer_types lists {len(a.layer_types)} layers but mtp.assistant.num_layers "
                        f"is {a.num_layers}; give one entry per assistant layer")
    if a.step_weights is not None and (len(a.step_weights) != mtp.num_layers or min(a.step_weights) < 0):
        raise UserError(f"mtp.assistant.step_weights {a.step_weights} must hold mtp.num_layers={mtp.num_layers} "
                        "weights of at least 0, one per draft step")
    if a.num_centroids < 0 or (a.num_centroids and not 0 < a.centroid_top_k <= a.num_centroids):
        raise UserError(f"mtp.assistant.num_centroids={a.num_centroids} and centroid_top_k={a.centroid_top_k}: give 0 "
                        "centroids (the whole output table), or a positive count and a top-k of at most that many")
    if a.num_centroids % cfg.parallel.tensor:
        raise UserError(f"mtp.assistant.num_centroids={a.num_centroids} is not divisible by parallel.tensor="
                        f"{cfg.parallel.tensor}; every tensor-parallel rank scores whole clusters")
    if a.num_attention_heads % cfg.parallel.tensor:
        raise UserError(f"mtp.assistant.num_attention_heads={a.num_attention_heads} is not divisible by "
                        f"parallel.tensor={cfg.parallel.tensor}; every tensor-parallel rank must hold whole heads")
