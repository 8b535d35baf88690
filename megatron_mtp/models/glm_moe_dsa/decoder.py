"""The decoder's layer for GLM-5: the DSA layer (models/dsa/decoder.py) with the indexer's RoPE on interleaved
pairs, as transformers' ``GlmMoeDsaIndexer``, and IndexShare by the view's ``indexer_types``."""

from megatron_mtp.models.dsa.decoder import DSALayer


class DSADecoderLayer(DSALayer):
    """GLM-5's decoder layer: a "shared" layer reuses the last full layer's top-k."""

    INDEX_INTERLEAVE = True
    TITLE = "GLM-5"
