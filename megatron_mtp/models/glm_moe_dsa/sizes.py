"""Analytic sizes of GLM-5: the DSA families' (models/dsa/sizes.py: MLA, the indexer where a layer runs its own,
sparse attention's cost beside dense MLA's), with each layer's attention shape (IndexShare's layers have no
indexer)."""

from megatron_mtp.models.dsa.sizes import (  # noqa: F401  (the family interface)
    attention_costs,
    attention_shape,
    decode_attention_flops,
    kv_cache_elements_per_token,
    layer_attention_shape,
    layer_sizes,
    mla_head_size,
    mtp_kv_cache_elements_per_token,
    parameter_counts,
    training_flops_per_token,
)
