"""Why a checkpoint write failed, in one sentence: the wording every writing command shares.

The helpers live in megatron_mtp/output.py (below every package that writes); this module keeps
the names the checkpoint saver and its tests import.
"""

from __future__ import annotations

from megatron_mtp.output import GIB, describe_failure, failure_errno, free_bytes, size_text

__all__ = ["GIB", "describe_failure", "failure_errno", "free_bytes", "size_text"]
