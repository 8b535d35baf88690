"""The decoder's layer for the DSA families: not built yet, so decoding refuses in one sentence (and
``generate`` does not list them: their ``Family.decodes`` is false)."""

from __future__ import annotations

from megatron_mtp.errors import UserError


def refusing_layer(title: str, hf_class: str) -> type:
    """A decoder layer class that refuses to run ``title`` (transformers' class ``hf_class`` serves it)."""

    class DSADecoderLayer:
        """Refuses: the decoder (inference/) has no DeepSeek Sparse Attention layer yet."""

        def __init__(self, *args, **kwargs) -> None:
            raise UserError(f"the decoder has no DeepSeek Sparse Attention layer yet, so it cannot run a {title} "
                            f"model; serve the export with transformers ({hf_class}), vLLM or SGLang instead")

    return DSADecoderLayer
