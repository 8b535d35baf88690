"""Typed view of a Hugging Face DeepSeek-V3/V2 ``config.json``: the MLA families' shared view
(models/mla/hf_view.py), which DeepSeek-V3 reads as is."""

from megatron_mtp.models.mla.hf_view import mtp_depth, parse_hf_config  # noqa: F401
