"""The decoder's layer for DeepSeek-V3.2: the DSA layer (models/dsa/decoder.py) with the indexer's RoPE in
rotate-half layout, as transformers' ``DeepseekV32Indexer``."""

from megatron_mtp.models.dsa.decoder import DSALayer


class DSADecoderLayer(DSALayer):
    """DeepSeek-V3.2's decoder layer: every layer, the MTP layer too, runs its own indexer."""

    INDEX_INTERLEAVE = False
    TITLE = "DeepSeek-V3.2"
