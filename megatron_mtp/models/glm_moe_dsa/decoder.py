"""The decoder's layer for GLM-5: not built yet (models/dsa/decoder.py), so decoding refuses in one sentence."""

from megatron_mtp.models.dsa.decoder import refusing_layer

DSADecoderLayer = refusing_layer("GLM-5", "GlmMoeDsaForCausalLM")
