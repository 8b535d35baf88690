"""The shape of a separate drafter model (``mtp.style: assistant``; Gemma 4's assistant,
models/gemma4/assistant/): its own width and layers, reading the target's stored keys and values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class AssistantShape:
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
