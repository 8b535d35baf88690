"""GLM-5's GPTModel of one pipeline stage: the DSA families' layer specs (models/dsa/model.py)."""

from megatron_mtp.models.dsa.model import build_model  # noqa: F401  (the family interface)
