"""The decoder's drafter of parallel MTP heads: K <= n drafts in one forward of the heads in mtp/
(inference/parallel_draft.py)."""

from __future__ import annotations

from megatron_mtp.inference.parallel_draft import load_parallel_heads


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    return load_parallel_heads(dirs, target, dtype)
