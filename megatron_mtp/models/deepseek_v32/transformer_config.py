"""DeepSeek-V3.2's megatron-core config: the DSA families' (models/dsa/transformer_config.py), the indexer's
RoPE rotating halves."""

from megatron_mtp.models.dsa.transformer_config import build_transformer_config, transformer_config_kwargs  # noqa: F401
