"""Analytic sizes of DeepSeek-V3.2: the DSA families' (models/dsa/sizes.py: MLA, the indexer in every layer,
sparse attention's cost beside dense MLA's)."""

from megatron_mtp.models.dsa.sizes import (  # noqa: F401  (the family interface)
    attention_costs,
    attention_shape,
    decode_attention_flops,
    kv_cache_elements_per_token,
    layer_sizes,
    mtp_kv_cache_elements_per_token,
    parameter_counts,
    training_flops_per_token,
)
