"""THE tensor table of DeepSeek-V3.2: the DSA families' (models/dsa/attention_table.py: MLA's rules and the
indexer's five tensors, in every layer and the MTP layer, the release's layer 61)."""

from megatron_mtp.models.dsa.attention_table import ATTENTION_ORDER, INDEXER, TABLE  # noqa: F401  (the family interface)
