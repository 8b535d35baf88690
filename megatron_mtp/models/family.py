"""A run's model family: one folder under models/ with one interface (models/README.md).

``model.family`` picks it; it is recorded in every checkpoint's config.yaml and a resume can't
change it (checkpoint/resume_rules.py). The trainer, ``plan`` and the analytic sizes reach the
family's model build, tensor table and layer kinds through ``get_family`` (the converter and the
inference decoder still import the DeepSeek-V3 folder directly: the one family today).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from megatron_mtp.errors import UserError

FAMILIES = ("deepseek_v3",)
"""Folders under models/ that implement INTERFACE (and the values model.family accepts)."""

INTERFACE = (
    # training: megatron-core's TransformerConfig and GPTModel for one pipeline stage
    "build_transformer_config", "build_model", "megatron_layout",
    # the tensor table: names, global shapes, TP splits, which layers hold what
    "param_table", "layer_rules", "block_rules", "mtp_own_rules", "HEAD_NORM", "is_moe_layer",
    "moe_layer_count", "mtp_is_moe",
    # analytic sizes
    "parameter_counts", "training_flops_per_token", "layer_sizes", "mtp_own_size",
    "kv_cache_elements_per_token",
    # the Hugging Face format
    "HF_ARCHITECTURES",
)


def get_family(name: str) -> ModuleType:
    """The family package ``megatron_mtp.models.<name>``, checked to provide INTERFACE."""
    if name not in FAMILIES:
        raise UserError(f"model.family '{name}' is not a model family here; use one of {', '.join(FAMILIES)}")
    module = importlib.import_module(f"megatron_mtp.models.{name}")
    missing = sorted(set(INTERFACE) - set(dir(module)))  # dir(): a family may load its pieces lazily
    if missing:
        raise RuntimeError(f"models/{name}/__init__.py does not provide {', '.join(missing)} (see models/README.md)")
    return module
