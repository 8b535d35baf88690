"""The assistant's model config (mtp.style assistant; what a run with one must satisfy: the family's checks,
models/gemma4/model_config.py ``check_assistant``).

The assistant is a Gemma 4 text stack of its own width (``mtp.assistant``): its config is the target's
(``model``) with the assistant's width, heads, MLP and layers, no experts, and the target's head widths,
RoPE and window, since its queries meet the target's keys. Each assistant layer reads the keys and values
the target's LAST layer of the same kind stores (``stored_layers``), which must therefore sit on the
pipeline stage that holds the loss, where the assistant runs.
"""

from __future__ import annotations

import dataclasses

from megatron_mtp.models.gemma4.model_config import Gemma4ModelConfig, stored_layers


def assistant_model(cfg) -> Gemma4ModelConfig:
    """The assistant's own text config: the target's, at the assistant's shape, without experts."""
    a, m = cfg.mtp.assistant, cfg.model
    return dataclasses.replace(m, hidden_size=a.hidden_size, num_layers=a.num_layers, layer_types=a.kinds(),
                               num_attention_heads=a.num_attention_heads, ffn_hidden_size=a.ffn_hidden_size,
                               num_experts=0, moe_ffn_hidden_size=0)


def assistant_stored(cfg) -> dict[str, int]:
    """The target layers (kind -> decoder layer) whose keys/values the assistant's layers read."""
    kinds = set(cfg.mtp.assistant.kinds())
    return {kind: i for kind, i in stored_layers(cfg.model).items() if kind in kinds}
