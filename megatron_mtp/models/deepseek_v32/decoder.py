"""The decoder's layer for DeepSeek-V3.2: not built yet (models/dsa/decoder.py), so decoding refuses in one
sentence."""

from megatron_mtp.models.dsa.decoder import refusing_layer

DSADecoderLayer = refusing_layer("DeepSeek-V3.2", "DeepseekV32ForCausalLM")
