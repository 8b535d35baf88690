"""The decoder's drafter of an EAGLE-3 export: the speculators-format drafter in the export's mtp/ (convert to-hf
writes it there beside the target in main/), drafting on the target's aux-layer states (draft.py)."""

from __future__ import annotations


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    from megatron_mtp.mtp_styles.eagle3.draft import load_eagle3

    return load_eagle3(drafter_dir, target, dtype) if drafter_dir is not None else None
