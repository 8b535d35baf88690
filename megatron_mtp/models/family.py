"""A run's model family: one folder under models/ with one interface (models/README.md).

``model.family`` picks it; it is recorded in every checkpoint's config.yaml and a resume can't
change it (checkpoint/resume_rules.py). The trainer, ``plan``, the analytic sizes and the converter
reach the family's model build, tensor table, layer kinds and Hugging Face config through
``get_family`` (a Hugging Face directory's family through ``family_of_hf_config``, by its
``model_type``, else its ``architectures``: ``hf_family_name``, which the inference decoder asks too).
"""

from __future__ import annotations

import importlib
from types import ModuleType

from megatron_mtp.errors import UserError

FAMILIES = ("deepseek_v3", "glm4_moe")
"""Folders under models/ that implement INTERFACE (and the values model.family accepts)."""

INTERFACE = (
    # training: megatron-core's TransformerConfig and GPTModel for one pipeline stage
    "build_transformer_config", "build_model", "megatron_layout",
    # the tensor table: names, global shapes, TP splits, which layers hold what
    "TABLE", "param_table", "layer_rules", "block_rules", "mtp_own_rules", "HEAD_NORM", "is_moe_layer",
    "moe_layer_count", "mtp_is_moe", "ATTENTION_ORDER",
    # analytic sizes
    "parameter_counts", "training_flops_per_token", "layer_sizes", "mtp_own_size",
    "kv_cache_elements_per_token", "decode_attention_flops",
    # the Hugging Face format: config.json both ways, what an export carries back of an imported one
    "ATTENTION", "HF_ARCHITECTURES", "HF_MODEL_TYPES", "to_hf_config", "from_hf_config", "carry_source_fields",
)


MEMBER_MODULES = {
    "build_transformer_config": "transformer_config", "megatron_layout": "transformer_config",
    "build_model": "model",
    "TABLE": "hf_mapping", "param_table": "hf_mapping", "layer_rules": "hf_mapping", "block_rules": "hf_mapping",
    "mtp_own_rules": "hf_mapping", "HEAD_NORM": "hf_mapping", "is_moe_layer": "hf_mapping",
    "moe_layer_count": "hf_mapping", "mtp_is_moe": "hf_mapping", "ATTENTION_ORDER": "hf_mapping",
    "parameter_counts": "size", "training_flops_per_token": "size", "layer_sizes": "size",
    "mtp_own_size": "size", "kv_cache_elements_per_token": "size", "decode_attention_flops": "size",
    "to_hf_config": "hf_config", "from_hf_config": "hf_config", "carry_source_fields": "hf_config",
}
"""Where each member of INTERFACE lives inside a family folder (every family lays its folder out the same
way; the constants ATTENTION, HF_ARCHITECTURES and HF_MODEL_TYPES sit in its __init__.py)."""


def lazy_members(package: str, constants: tuple[str, ...], where: dict[str, str] = MEMBER_MODULES):
    """(``__getattr__``, ``__dir__``) of a family package whose interface members live in its modules
    (``where``: member -> module), imported when first used, so that naming a family imports neither
    torch nor megatron-core."""

    def getattr_(name: str):
        if name in where:
            return getattr(importlib.import_module(f"{package}.{where[name]}"), name)
        raise AttributeError(name)

    def dir_() -> list[str]:
        return sorted([*where, *constants])

    return getattr_, dir_


def get_family(name: str) -> ModuleType:
    """The family package ``megatron_mtp.models.<name>``, checked to provide INTERFACE."""
    if name not in FAMILIES:
        raise UserError(f"model.family '{name}' is not a model family here; use one of {', '.join(FAMILIES)}")
    module = importlib.import_module(f"megatron_mtp.models.{name}")
    missing = sorted(set(INTERFACE) - set(dir(module)))  # dir(): a family may load its pieces lazily
    if missing:
        raise RuntimeError(f"models/{name}/__init__.py does not provide {', '.join(missing)} (see models/README.md)")
    return module


def hf_family_name(raw) -> str | None:
    """The family a Hugging Face config.json dict declares: by its ``model_type``, or, in a file without
    one, by its ``architectures``; None for any other (the importer and the decoder both ask this)."""
    if not hasattr(raw, "get"):
        return None
    model_type, architectures = raw.get("model_type"), raw.get("architectures") or ()
    for name in FAMILIES:
        family = get_family(name)
        if model_type in family.HF_MODEL_TYPES or (
                model_type is None and any(a in family.HF_ARCHITECTURES for a in architectures)):
            return name
    return None


def family_of_hf_config(raw) -> ModuleType:
    """The family that reads a Hugging Face config.json dict (``hf_family_name``); DeepSeek-V3's reader
    for any other (it names what it cannot read)."""
    return get_family(hf_family_name(raw) or "deepseek_v3")
