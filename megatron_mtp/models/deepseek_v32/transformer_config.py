"""DeepSeek-V3.2's megatron-core config: the DSA families' (models/dsa/transformer_config.py), the indexer's
RoPE rotating halves."""

from megatron_mtp.models.dsa.transformer_config import (  # noqa: F401  (the family interface and its tests)
    build_transformer_config,
    common_kwargs,
    megatron_layout,
    moe_layer_pattern,
    sequence_parallel,
    transformer_config_kwargs,
)
