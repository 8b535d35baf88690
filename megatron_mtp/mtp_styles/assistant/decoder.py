"""The decoder's drafter of a separate drafter: its own directory (the export's mtp/), built and checked against the
target by the family whose drafter it is (inference/generate.py ``load_assistant``)."""

from __future__ import annotations

from megatron_mtp.inference.generate import load_assistant


def load_drafter(dirs, drafter_dir, target, main_weights, dtype, chain_hidden):
    return load_assistant(drafter_dir, target, dtype) if drafter_dir is not None else None
