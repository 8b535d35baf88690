"""Reading `generate --prompts-file F`: one prompt per line, or JSON Lines when F ends in `.jsonl` or
`.ndjson` (in any case). A UTF-8 byte-order mark at the start of F is not part of the first prompt.

A `.jsonl` line is an object with a "prompt" (text, or a list of token ids) and, optionally, its own
"max_new_tokens". Blank lines are skipped in both formats; every prompt keeps the number of its line,
so an error about it names the line ("the prompt on line 3 of F ...").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from megatron_mtp.errors import UserError

JSON_LINES_SUFFIXES = (".jsonl", ".ndjson")


@dataclass(frozen=True)
class FilePrompt:
    prompt: str | list[int]
    label: str  # "the prompt on line N of F"
    max_new_tokens: int


def _json_prompt(text: str, where: str, default_budget: int) -> tuple[str | list[int], int]:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise UserError(f"{where} is not valid JSON ({exc.msg}); write one object like "
                        '{"prompt": "..."} per line.') from None
    prompt = obj.get("prompt") if isinstance(obj, dict) else None
    ids_ok = isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    if not (isinstance(prompt, str) or ids_ok):
        raise UserError(f'{where} has no "prompt" text or list of token ids; write one object like '
                        '{"prompt": "..."} per line.')
    budget = obj.get("max_new_tokens", default_budget)
    if not isinstance(budget, int) or isinstance(budget, bool) or budget < 1:
        raise UserError(f'{where} has "max_new_tokens" {budget!r}; give a whole number of at least 1.')
    return prompt, budget


def read_prompts_file(path: Path, default_budget: int) -> list[FilePrompt]:
    """The prompts of F in file order; a UserError names the file and line of what is wrong."""
    if path.is_dir():
        raise UserError(f"prompts file {path} is a directory; pass a file of prompts to --prompts-file.")
    if not path.is_file():
        raise UserError(f"prompts file {path} does not exist; pass an existing file to --prompts-file.")
    try:
        lines = path.read_text(encoding="utf-8-sig").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"prompts file {path} cannot be read as UTF-8 text ({exc}).") from exc
    jsonl = path.suffix.lower() in JSON_LINES_SUFFIXES
    out = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        where = f"line {number} of {path}"
        prompt, budget = _json_prompt(line, where, default_budget) if jsonl else (line, default_budget)
        out.append(FilePrompt(prompt=prompt, label=f"the prompt on {where}", max_new_tokens=budget))
    if not out:
        raise UserError(f"prompts file {path} has no prompts; put one prompt per line (a .jsonl file: one "
                        '{"prompt": "..."} object per line).')
    return out
