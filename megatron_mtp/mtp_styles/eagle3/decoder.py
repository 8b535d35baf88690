"""The decoder's drafter of an EAGLE-3 export: not built yet (``generate --speculative`` drafts with the MTP layers
of the sequential and parallel styles and with an assistant); an EAGLE-3 export decodes without one."""

from __future__ import annotations


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    return None
