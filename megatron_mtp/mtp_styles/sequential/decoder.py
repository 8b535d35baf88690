"""The decoder's drafter of sequential MTP modules: the export's MTP layers (inline or in mtp/) chained as
megatron-core trains them (inference/draft.py ``MTPDrafter``)."""

from __future__ import annotations

from megatron_mtp.inference.draft import MTPDrafter
from megatron_mtp.inference.model_dir import load_mtp_modules


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    """The drafter of an export's MTP modules, or None where it has none."""
    modules = load_mtp_modules(dirs, target, main_weights, dtype)
    return MTPDrafter(modules, chain_hidden=chain_hidden) if modules else None
