"""What an imported Hugging Face model said about itself, kept so that ``to-hf`` can say it again.

``from-hf`` stores the source's ``config.json`` and ``generation_config.json`` verbatim under
``CKPT/hf_source/``. ``to-hf`` writes back every value of them that still holds for the checkpoint
it exports (``hf_config.carry_source_fields`` decides for config.json), so HF -> from-hf -> to-hf
keeps fields such as ``head_dim``, ``pad_token_id`` or a list of end-of-turn ids that our model
config has no place for.

Special token ids: the exported tokenizer names its BOS/EOS/PAD tokens; the id it gives wins over a
stored one that differs (the tokenizer is what ships), except that a stored list of EOS ids that
contains the tokenizer's stays a list. A checkpoint trained further from an import does not carry
``hf_source/`` (the trainer writes only config.yaml, tokenizer/ and train_state.json); its export
takes the ids from the tokenizer and the rest from the model config.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Optional

from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR
from megatron_mtp.errors import UserError
from megatron_mtp.models.hf_common import TOKEN_ID_KEYS, merge_token_id

SOURCE_DIR = "hf_source"
GENERATION_CONFIG = "generation_config.json"
_RECORDED = ("config.json", GENERATION_CONFIG)


def record_source(hf_dir: Path, checkpoint_dir: Path) -> None:
    """Copy the source's config.json (and generation_config.json, if any) into the checkpoint."""
    dst = checkpoint_dir / SOURCE_DIR
    dst.mkdir()
    for name in _RECORDED:
        if (hf_dir / name).is_file():
            shutil.copy2(hf_dir / name, dst / name)


def copy_source_record(src_checkpoint: Path, dst_checkpoint: Path) -> None:
    """Carry ``hf_source/`` from one checkpoint directory to another (drop-mtp)."""
    if (src_checkpoint / SOURCE_DIR).is_dir():
        shutil.copytree(src_checkpoint / SOURCE_DIR, dst_checkpoint / SOURCE_DIR)


def _read_json(path: Path) -> Optional[dict[str, Any]]:
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{path} is not valid JSON; remove it or repair it") from None
    if not isinstance(data, dict):
        raise UserError(f"{path} does not hold a JSON object; remove it or repair it")
    return data


def source_config(checkpoint_dir: Path) -> Optional[dict[str, Any]]:
    """The config.json the checkpoint was imported from, or None."""
    return _read_json(checkpoint_dir / SOURCE_DIR / "config.json")


def source_generation_config(checkpoint_dir: Path) -> Optional[dict[str, Any]]:
    """The imported generation_config.json: ``hf_source/``, or ``tokenizer/`` where older imports put it."""
    for folder in (SOURCE_DIR, TOKENIZER_DIR):
        found = _read_json(checkpoint_dir / folder / GENERATION_CONFIG)
        if found is not None:
            return found
    return None


def generation_config(
    tokenizer_ids: dict[str, Optional[int]], config_ids: dict[str, Any], stored: Optional[dict[str, Any]]
) -> Optional[dict[str, Any]]:
    """generation_config.json for an export: the imported one with its ids brought up to date, else the
    special token ids config.json states (nothing that would change sampling); None when none is known."""
    if stored is not None:
        out = {k: v for k, v in stored.items() if k != "transformers_version"}  # who wrote the source file
        for key in TOKEN_ID_KEYS:
            value = merge_token_id(tokenizer_ids.get(key), stored.get(key))
            if value is not None:
                out[key] = value
        return out
    out = {key: config_ids[key] for key in TOKEN_ID_KEYS if config_ids.get(key) is not None}
    return out or None
