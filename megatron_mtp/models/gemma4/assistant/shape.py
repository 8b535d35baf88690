"""The assistant's model config and what a run with one must satisfy (mtp.style assistant).

The assistant is a Gemma 4 text stack of its own width (``mtp.assistant``): its config is the target's
(``model``) with the assistant's width, heads, MLP and layers, no experts, and the target's head widths,
RoPE and window, since its queries meet the target's keys. Each assistant layer reads the keys and values
the target's LAST layer of the same kind stores (``stored_layers``), which must therefore sit on the
pipeline stage that holds the loss, where the assistant runs.
"""

from __future__ import annotations

import dataclasses

from megatron_mtp.config import pipeline_layout
from megatron_mtp.errors import UserError
from megatron_mtp.models.gemma4.model_config import FULL, SLIDING, Gemma4ModelConfig, kind_groups


def assistant_model(cfg) -> Gemma4ModelConfig:
    """The assistant's own text config: the target's, at the assistant's shape, without experts."""
    a, m = cfg.mtp.assistant, cfg.model
    return dataclasses.replace(m, hidden_size=a.hidden_size, num_layers=a.num_layers, layer_types=a.kinds(),
                               num_attention_heads=a.num_attention_heads, ffn_hidden_size=a.ffn_hidden_size,
                               num_experts=0, moe_ffn_hidden_size=0)


def stored_layers(model: Gemma4ModelConfig) -> dict[str, int]:
    """kind -> the target's decoder layer whose keys/values an assistant layer of that kind reads (the last one)."""
    kinds = model.layer_kinds()
    return {kind: max(i for i, k in enumerate(kinds) if k == kind) for kind in (SLIDING, FULL) if kind in kinds}


def check_assistant(cfg) -> None:
    """One sentence for the first thing a Gemma 4 run with an assistant cannot take."""
    a, m, p = cfg.mtp.assistant, cfg.model, cfg.parallel
    kinds, stored = a.kinds(), stored_layers(m)
    for kind in kinds:
        if kind not in (SLIDING, FULL):
            raise UserError(f"mtp.assistant.layer_types holds {kind!r}; each entry must be {SLIDING} or {FULL}")
        if kind not in stored:
            raise UserError(f"the assistant has {kind} layers, which read the target's last {kind} layer, and the "
                            f"target (model.layer_types) has none; use the target's kinds in mtp.assistant.layer_types")
        if a.num_attention_heads % kind_groups(m, kind):
            raise UserError(f"mtp.assistant.num_attention_heads={a.num_attention_heads} must be a multiple of the "
                            f"target's {kind} key/value heads ({kind_groups(m, kind)}), whose keys it reads")
    last = pipeline_layout.stages(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                  p.pipeline_layout)[-1]
    away = sorted(i for kind, i in stored.items() if kind in kinds and i not in last.layers)
    if away:
        raise UserError(f"the assistant reads the keys and values of decoder layer {away[0]}, which the pipeline "
                        f"places away from the last stage (it holds layers {list(last.layers)}); put the target's "
                        "last layer of each kind on the last stage with parallel.pipeline_layout")
