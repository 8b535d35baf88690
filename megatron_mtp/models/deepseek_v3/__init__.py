"""DeepSeek-V3 family (MLA attention, DeepSeek MoE, sequential MTP modules or parallel heads).

The family interface of models/family.py, loaded lazily so that naming the family imports neither
torch nor megatron-core until a piece is used.
"""

from __future__ import annotations

from megatron_mtp.models.family import lazy_members

ATTENTION = "mla"
"""The attention kind: "mla" (multi-head latent) or "gqa" (grouped-query)."""
HF_ARCHITECTURES = ("DeepseekV3ForCausalLM",)
"""What our Hugging Face exports declare (and imports accept)."""
HF_MODEL_TYPES = ("deepseek_v3", "deepseek_v2")
"""config.json ``model_type`` values this family reads."""


__getattr__, __dir__ = lazy_members(__name__, ("ATTENTION", "HF_ARCHITECTURES", "HF_MODEL_TYPES"))
