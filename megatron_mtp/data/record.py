"""The datasets a run reads, recorded with each checkpoint and held to at resume.

Design note. `data.paths` entries are expanded at every start (globs over shards, @list files), so
a restart that sees one more shard, or a list file edited in between, would read another blend: the
sample order (data/passes.py) depends on every dataset and its size, and nothing would say so. The
checkpoint's train_state.json therefore carries `data_prefixes` (`prefix_record`: the absolute
train and validation prefixes as resolved, globs expanded), and a resume whose resolution gives
other lists is one sentence (`refuse_changed_prefixes`) unless data.allow_changed_paths accepts it,
which is then a note in the start-up lines. The default corpus is recorded as such, not by its
cache paths, so moving the cache does not count as a change. Checkpoints without the record (older
ones) are resumed as before.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Optional

from megatron_mtp.errors import UserError

KEY = "data_prefixes"
"""The train_state.json field holding `prefix_record`."""


def prefix_record(resolved: Any) -> dict[str, Any]:
    """What a run reads: {'train': [prefixes], 'valid': [prefixes] or None}, or {'default_corpus': True}."""
    if resolved.default_corpus is not None:
        return {"default_corpus": True}
    return {"train": list(resolved.train_prefixes),
            "valid": list(resolved.valid_prefixes) if resolved.valid_prefixes is not None else None}


def _describe(names: list[str]) -> str:
    shown = ", ".join(os.path.basename(n) for n in names[:3])
    return shown + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _difference(saved: dict, now: dict) -> Optional[str]:
    if saved.get("default_corpus") or now.get("default_corpus"):
        if bool(saved.get("default_corpus")) == bool(now.get("default_corpus")):
            return None
        was, is_ = (("the default corpus", "data.paths") if saved.get("default_corpus")
                    else ("data.paths", "the default corpus"))
        return f"it was trained on {was} and this start reads {is_}"
    for part, what in (("train", "train datasets"), ("valid", "validation datasets")):
        before, after = saved.get(part), now.get(part)
        if before == after:
            continue
        if before is None or after is None:
            return f"its {what} were {'set' if after is None else 'not set'} and now are {'not ' * (after is None)}set"
        gone = [p for p in before if p not in after]
        new = [p for p in after if p not in before]
        if gone or new:
            change = "; ".join(x for x in (f"{len(new)} new ({_describe(new)})" if new else "",
                                           f"{len(gone)} no longer found ({_describe(gone)})" if gone else "") if x)
            return f"its {what} resolve to {len(after)} datasets where the checkpoint read {len(before)}: {change}"
        return f"its {what} are the same datasets in another order"
    return None


def refuse_changed_prefixes(saved_state: dict, resolved: Any, allow: bool, step_dir: Path, run_dir: Path
                            ) -> Optional[str]:
    """UserError when this start would read other datasets than the checkpoint's run did (unless `allow`,
    then the note to show); None when they are the same or the checkpoint has no record."""
    saved = saved_state.get(KEY)
    if not isinstance(saved, dict):
        return None
    change = _difference(saved, prefix_record(resolved))
    if change is None:
        return None
    if allow:
        return f"the data differs from {step_dir.name}'s ({change}); read as data.allow_changed_paths=true asks"
    raise UserError(f"cannot resume {run_dir} from {step_dir.name}: {change}, which changes the order of every "
                    f"sample from here on (a glob in data.paths sees other shards?); restore the datasets the run "
                    "read, or accept the new ones with data.allow_changed_paths=true")
