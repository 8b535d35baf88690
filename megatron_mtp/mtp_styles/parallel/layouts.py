"""The export layouts parallel MTP heads cannot take (their format: mtp_styles/parallel/hf_format.py), and why no
serving engine drafts with them."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.errors import UserError


def unserved_sentence(title: str) -> str:
    """Why ``--for`` refuses parallel MTP heads (and the SERVING.md note without it)."""
    return (f"{title} drafts only with DeepSeek-V3's sequential MTP modules, and this checkpoint has parallel MTP "
            "heads; export without --for (OUT/mtp then holds the heads, which megatron-mtp generate --speculative "
            "K drafts with) or with --mtp none")


def refuse_layout(serve_for: Optional[str], mtp: str, mtp_layout: str) -> None:
    """What an export of parallel heads cannot be, one sentence each (serving engines: convert/serving.py)."""
    from megatron_mtp.convert import serving

    if serve_for is not None:
        raise UserError(unserved_sentence(serving.FACTS[serve_for].title))
    if mtp == "inline":
        raise UserError("--mtp inline needs sequential MTP modules (the Hugging Face layers "
                        "num_hidden_layers+d), and this checkpoint has parallel MTP heads, which have no Hugging "
                        "Face format; export with --mtp separate (OUT/mtp holds the heads) or --mtp none")
    if mtp_layout == "nextn":
        raise UserError("--mtp-layout nextn is SGLang's layout for one sequential MTP module, and this checkpoint "
                        "has parallel MTP heads; export with --mtp-layout hf (OUT/mtp holds the heads)")
