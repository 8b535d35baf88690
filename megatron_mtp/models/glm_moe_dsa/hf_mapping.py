"""THE tensor table of GLM-5: the DSA families' (models/dsa/attention_table.py: MLA's rules and the indexer's
five tensors), the indexer only in the layers that run their own (IndexShare), the MTP layer's included."""

from megatron_mtp.models.dsa.attention_table import ATTENTION_ORDER, INDEXER, TABLE  # noqa: F401  (the family interface)
