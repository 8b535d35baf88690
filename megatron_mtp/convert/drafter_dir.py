"""A separate drafter's rows in the converters' one table (an MTP style with ``separate_drafter``: a model of its
own, exported to a directory of its own, OUT/mtp).

Its Hugging Face names are those of its own directory, which may also be the target's (both have
``model.layers.0...``, ``model.embed_tokens.weight``), so its rows (the style's ``convert.drafter_params``) name
them ``DRAFTER_DIR + name``: the prefix keeps them apart while the table is one list. ``to-hf`` drops it where it
writes a tensor into the drafter's directory (``dir_name``); ``from-hf`` adds it where it reads one from there.
"""

from __future__ import annotations

DRAFTER_DIR = "assistant/"
"""Table names of tensors that live in a separate drafter's own directory."""


def table_name(name: str) -> str:
    """A tensor's name inside the drafter's directory -> its name in the table."""
    return DRAFTER_DIR + name


def dir_name(name: str) -> str:
    """A table name -> the tensor's name inside the drafter's directory (other names unchanged)."""
    return name[len(DRAFTER_DIR):] if name.startswith(DRAFTER_DIR) else name


def in_drafter_dir(name: str) -> bool:
    """Whether a table name is one of a separate drafter's own tensors."""
    return name.startswith(DRAFTER_DIR)
