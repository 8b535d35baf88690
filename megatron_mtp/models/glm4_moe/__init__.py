"""GLM-4.5 / 4.6 / 4.7 family (``Glm4MoeForCausalLM``): grouped-query attention with partial RoPE and
optional q/k norms and qkv bias, DeepSeek-style MoE, DeepSeek-V3-style sequential MTP modules.

The family interface of models/family.py, loaded lazily so that naming the family imports neither
torch nor megatron-core until a piece is used.
"""

from __future__ import annotations

from megatron_mtp.models.family import lazy_members

ATTENTION = "gqa"
"""The attention kind: "mla" (multi-head latent) or "gqa" (grouped-query)."""
HF_ARCHITECTURES = ("Glm4MoeForCausalLM",)
"""What our Hugging Face exports declare (and imports accept)."""
HF_MODEL_TYPES = ("glm4_moe",)
"""config.json ``model_type`` values this family reads."""


__getattr__, __dir__ = lazy_members(__name__, ("ATTENTION", "HF_ARCHITECTURES", "HF_MODEL_TYPES"))
