"""Finding a checkpoint step directory and what it records (config, tokenizer, train state).

A path may be a run directory (``checkpoints/latest`` names the newest complete step) or a step
directory itself (``checkpoints/step_NNNNNNN`` with ``metadata.json``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from megatron_mtp.errors import UserError


def resolve_step_dir(path: str | Path) -> Path:
    path = Path(path)
    if not path.exists():
        raise UserError(f"checkpoint path '{path}' does not exist")
    if (path / "metadata.json").is_file():
        return path
    for base in (path / "checkpoints", path):
        latest = base / "latest"
        if latest.is_file():
            name = latest.read_text().strip()
            step = base / name
            if not name or not (step / "metadata.json").is_file():
                raise UserError(f"'{latest}' names '{name}', which is not a complete checkpoint directory")
            return step
    raise UserError(
        f"'{path}' is neither a checkpoint step directory (no metadata.json) nor a run directory "
        "(no checkpoints/latest); pass RUN_DIR or RUN_DIR/checkpoints/step_N"
    )


def load_step_config(step: Path):
    from megatron_mtp.config import load_config

    config_file = step / "config.yaml"
    if not config_file.is_file():
        raise UserError(f"checkpoint '{step}' has no config.yaml; it was not written by megatron-mtp train or convert")
    return load_config(str(config_file))


def load_train_state(step: Path) -> dict[str, Any]:
    file = step / "train_state.json"
    if not file.is_file():
        return {}
    try:
        return json.loads(file.read_text())
    except ValueError:
        raise UserError(f"'{file}' is not valid JSON; the checkpoint is damaged") from None


def copy_tokenizer(src: Path, dst: Path) -> bool:
    """Copy the tokenizer files of ``src`` (a directory) into ``dst``; False when there are none."""
    if not src.is_dir():
        return False
    copied = False
    for item in sorted(src.iterdir()):
        if item.is_file():
            shutil.copy2(item, dst / item.name)
            copied = True
    return copied


TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "generation_config.json",
)


def special_token_ids(tok_dir: Path) -> tuple[int | None, int | None]:
    """(bos, eos) ids named by tokenizer_config.json, looked up in tokenizer.json; None if unknown."""
    config_file, tokenizer_file = tok_dir / "tokenizer_config.json", tok_dir / "tokenizer.json"
    if not config_file.is_file() or not tokenizer_file.is_file():
        return None, None
    try:
        from tokenizers import Tokenizer

        config = json.loads(config_file.read_text())
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception:  # an unreadable tokenizer only costs the ids in config.json
        return None, None

    def lookup(entry) -> int | None:
        if isinstance(entry, dict):
            entry = entry.get("content")
        return tokenizer.token_to_id(entry) if isinstance(entry, str) else None

    return lookup(config.get("bos_token")), lookup(config.get("eos_token"))
