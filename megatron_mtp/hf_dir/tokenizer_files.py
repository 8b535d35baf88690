"""Tokenizer files that travel between checkpoints and Hugging Face directories, and the special
token ids an exported config.json records."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Optional


def copy_tokenizer(src: Path, dst: Path) -> bool:
    """Copy the tokenizer files of ``src`` (a directory) into ``dst``; False when there are none.

    A generation_config.json there (older imports put one) is left out: the export writes its own."""
    if not src.is_dir():
        return False
    copied = False
    for item in sorted(src.iterdir()):
        if item.is_file() and item.name != "generation_config.json":
            shutil.copy2(item, dst / item.name)
            copied = True
    return copied


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json",
)


def special_token_ids(tok_dir: Path) -> dict[str, Optional[int]]:
    """{bos,eos,pad}_token_id named by tokenizer_config.json, looked up in tokenizer.json; None if unknown."""
    unknown: dict[str, Optional[int]] = {f"{kind}_token_id": None for kind in ("bos", "eos", "pad")}
    config_file, tokenizer_file = tok_dir / "tokenizer_config.json", tok_dir / "tokenizer.json"
    if not config_file.is_file() or not tokenizer_file.is_file():
        return unknown
    try:
        from tokenizers import Tokenizer

        config = json.loads(config_file.read_text())
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # an unreadable tokenizer only costs the ids in config.json
        return unknown
    if not isinstance(config, dict):
        return unknown

    def lookup(entry) -> Optional[int]:
        if isinstance(entry, dict):
            entry = entry.get("content")
        return tokenizer.token_to_id(entry) if isinstance(entry, str) else None

    return {f"{kind}_token_id": lookup(config.get(f"{kind}_token")) for kind in ("bos", "eos", "pad")}
