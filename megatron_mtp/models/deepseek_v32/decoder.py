"""The decoder's layer for DeepSeek-V3.2: not built yet, so decoding refuses in one sentence."""

from __future__ import annotations

from megatron_mtp.errors import UserError


class DSADecoderLayer:
    """Refuses: the decoder (inference/) has no DeepSeek Sparse Attention layer yet."""

    def __init__(self, *args, **kwargs) -> None:
        raise UserError("the decoder has no DeepSeek Sparse Attention layer yet, so it cannot run a DeepSeek-V3.2 "
                        "model; serve the export with transformers (DeepseekV32ForCausalLM), vLLM or SGLang instead")
