"""The decoder's drafter of parallel MTP heads: K <= n drafts in one forward of the heads in mtp/
(mtp_styles/parallel/drafter.py)."""

from __future__ import annotations

from megatron_mtp.mtp_styles.parallel.drafter import load_parallel_heads


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    return load_parallel_heads(dirs, target, dtype)
