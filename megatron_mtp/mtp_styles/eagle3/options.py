"""The options of an EAGLE-3 drafter, the config section ``mtp.eagle3`` (the style's ``options``;
config/model.py ``mtp_config_class``): a small dense decoder on the frozen target's hidden states at a few of its
layers, in the speculators format's terms. Its checks and the values of its null fields are shape.py's. No torch:
reading a config imports this module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class Eagle3Options:
    """``mtp.eagle3``: the drafter's shape and training (mtp.style eagle3; mtp.num_layers is its draft steps)."""

    aux_layers: Optional[list[int]] = None
    """The target's hidden states the drafter reads (speculators' eagle_aux_hidden_state_layer_ids): id i is the
    hidden state entering decoder layer i (0-based), i.e. the output of layer i counted from 1; 0 is the
    embeddings and model.num_layers the last layer's output before the final norm. null: speculators' default
    [2, L // 2, L - 3] (a low, a middle and a high layer of the target's L)."""
    num_layers: int = 1
    """Its decoder layers; the first reads [token embedding ; hidden state] (2 × hidden), the others the hidden."""
    num_attention_heads: Optional[int] = None
    """Query heads per layer. null: the target's model.num_attention_heads."""
    num_query_groups: Optional[int] = None
    """Key/value heads per layer (HF num_key_value_heads). null: as many as the query heads."""
    head_dim: Optional[int] = None
    """Width of each head. null: model.hidden_size / num_attention_heads."""
    ffn_hidden_size: Optional[int] = None
    """Width of its SwiGLU MLP (HF intermediate_size). null: the target's model.ffn_hidden_size."""
    draft_vocab_size: Optional[int] = None
    """Tokens its output head scores: the most frequent ones of the training data (counted over
    vocab_count_tokens of it when a new drafter starts), mapped to the target's ids by its d2t/t2d tables.
    null: the target's whole vocabulary (no tables)."""
    vocab_count_tokens: int = 10_000_000
    """Training tokens counted to pick the draft vocabulary (the first of each train prefix, shared out)."""
    step_loss_decay: float = 1.0
    """Weight γ^k of draft step k's loss (speculators' ttt_step_loss_decay; steps counted from 0)."""
    norm_before_residual: bool = False
    """The first layer's residual is its normed hidden-state input (speculators' norm_before_residual)."""
    norm_output: bool = False
    """Each step feeds its final-normed hidden state to the next (Eagle 3.1, speculators' norm_output)."""
    train_lm_head: bool = False
    """Train the output head too; false: it stays the target's output rows of the draft vocabulary, as
    speculators 0.9.0 keeps it."""
