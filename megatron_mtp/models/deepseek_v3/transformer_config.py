"""DeepSeek-V3's megatron-core config: the MLA families' MLATransformerConfig (models/mla/transformer_config.py)."""

from megatron_mtp.models.mla.transformer_config import (  # noqa: F401  (the family interface and its tests)
    build_transformer_config,
    megatron_layout,
    moe_layer_pattern,
    transformer_config_kwargs,
)
