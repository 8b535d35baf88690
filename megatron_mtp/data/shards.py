"""Sharded preprocessing and the merge of its shards (`preprocess --shard I/N`, `merge-datasets`).

Design note. A corpus too big for one host is tokenised by N independent runs (a Slurm array:
`--shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT`). Every run expands the same inputs to the
same sorted file list and takes the I-th of N contiguous blocks of it (files are never split, so a
shard's documents are a contiguous run of the unsharded dataset's), writing PREFIX_shard-0000I-of-0000N.
Because each document's tokens depend only on its own text, merging the shards in index order gives
the unsharded dataset byte for byte (tested). The merge refuses a missing, doubled or foreign shard
(another N, another tokenizer) by name, and publishes like preprocess (temporary names, .idx last).
Training can also take the shards without a merge: `data.paths: [PREFIX_shard-*]` (data/prefixes.py).
"""

from __future__ import annotations

import os
import re
import time
from typing import Optional

from megatron_mtp.data.indexed import IndexedWriter, check_indexed_pair
from megatron_mtp.errors import UserError

_SHARD_RE = re.compile(r"_shard-(\d{5})-of-(\d{5})$")


def parse_shard(text: str) -> tuple[int, int]:
    """'I/N' (0-based I, as SLURM_ARRAY_TASK_ID counts) -> (I, N)."""
    match = re.fullmatch(r"\s*(\d+)\s*/\s*(\d+)\s*", text or "")
    if not match:
        raise UserError(f"--shard '{text}' is not I/N; pass e.g. --shard 0/8 (shard I of N, counting from 0)")
    index, count = int(match.group(1)), int(match.group(2))
    if count < 1 or index >= count:
        raise UserError(f"--shard {text}: I must be below N and N at least 1 (shards count from 0: 0/{count} "
                        f"to {max(count - 1, 0)}/{count})")
    return index, count


def select_shard(files: list[str], index: int, count: int) -> list[str]:
    """The index-th of `count` contiguous, nearly equal blocks of `files`."""
    if count > len(files):
        raise UserError(f"--shard {index}/{count}: the inputs hold only {len(files)} files, so {count} shards "
                        f"would leave some empty; use at most {len(files)} shards")
    start, stop = index * len(files) // count, (index + 1) * len(files) // count
    return files[start:stop]


def shard_prefix(prefix: str, index: int, count: int) -> str:
    return f"{prefix}_shard-{index:05d}-of-{count:05d}"


def order_shards(prefixes: list[str]) -> list[str]:
    """Prefixes in merge order: shards of one preprocess sorted by index, all present exactly once;
    other prefixes are kept in the order given."""
    found = [(p, _SHARD_RE.search(p)) for p in prefixes]
    shards = [(p, m) for p, m in found if m]
    if not shards:
        return prefixes
    if len(shards) != len(prefixes):
        plain = next(p for p, m in found if not m)
        raise UserError(f"--input mixes the shards of a sharded preprocess with '{plain}'; merge the shards "
                        "alone, then blend the result with the other dataset in data.paths")
    stems = {_SHARD_RE.sub("", p) for p, _ in shards}
    counts = {int(m.group(2)) for _, m in shards}
    if len(stems) > 1 or len(counts) > 1:
        raise UserError(f"--input holds shards of more than one preprocess ({', '.join(sorted(stems))}; "
                        f"{', '.join(map(str, sorted(counts)))} shards); merge each one on its own")
    stem, count = stems.pop(), counts.pop()
    by_index: dict[int, str] = {}
    for p, m in shards:
        if int(m.group(1)) in by_index:
            raise UserError(f"--input names shard {int(m.group(1))} of {count} twice; name each shard once")
        by_index[int(m.group(1))] = p
    missing = [i for i in range(count) if i not in by_index]
    if missing:
        raise UserError(f"{_missing_words(stem, count, missing)}: its preprocess has not finished; run it "
                        f"(--shard {missing[0]}/{count}) and merge again")
    return [by_index[i] for i in range(count)]


def _missing_words(stem: str, count: int, missing: list[int]) -> str:
    shown = ", ".join(os.path.basename(shard_prefix(stem, i, count)) for i in missing[:3])
    more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
    return (f"shard{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing[:3]))}{more} of {count} "
            f"({shard_prefix(stem, missing[0], count) if len(missing) == 1 else shown + more}) "
            f"{'are' if len(missing) > 1 else 'is'} missing")


def missing_shards(prefixes: list[str]) -> Optional[str]:
    """What is missing among the sharded-preprocess outputs in `prefixes` (each preprocess's shards
    0..N-1 all present: the rule merge-datasets applies), or None; other prefixes are ignored."""
    groups: dict[tuple[str, int], set[int]] = {}
    for p in prefixes:
        m = _SHARD_RE.search(p)
        if m:
            groups.setdefault((_SHARD_RE.sub("", p), int(m.group(2))), set()).add(int(m.group(1)))
    for (stem, count), present in sorted(groups.items()):
        missing = [i for i in range(count) if i not in present]
        if missing:
            return _missing_words(stem, count, missing)
    return None


def merge_datasets(prefixes: list[str], output_prefix: str, progress: bool = True) -> dict:
    """Concatenate indexed datasets made with one tokenizer into `output_prefix`; returns its meta."""
    prefixes = order_shards(prefixes)
    if os.path.abspath(output_prefix) in {os.path.abspath(p) for p in prefixes}:
        raise UserError(f"--output-prefix '{output_prefix}' is also an input; write the merge to a new prefix")
    infos = [check_indexed_pair(p) for p in prefixes]
    first = infos[0]
    tokenizer = (first.meta or {}).get("tokenizer")
    for info in infos[1:]:
        for key in ("fingerprint", "vocab_size", "eod_id"):
            mine, theirs = ((info.meta or {}).get("tokenizer") or {}).get(key), (tokenizer or {}).get(key)
            if mine != theirs:
                raise UserError(f"dataset '{info.prefix}' was tokenised with another tokenizer than "
                                f"'{first.prefix}' ({key} {mine} vs {theirs}); merge datasets of one tokenizer")
        if info.dtype != first.dtype:
            raise UserError(f"dataset '{info.prefix}' stores {info.dtype.__name__} tokens, '{first.prefix}' "
                            f"{first.dtype.__name__}; merge datasets of one tokenizer")
    if tokenizer is None:
        raise UserError(f"dataset '{first.prefix}' has no {os.path.basename(first.prefix)}.meta.json, so its "
                        "tokenizer is unknown; re-run `megatron-mtp preprocess` for it")
    from megatron_mtp.write_causes import write_failures

    bar = _bar(sum(i.tokens for i in infos), progress)
    start = time.perf_counter()
    prefix = os.path.abspath(output_prefix)
    with write_failures(prefix, "dataset", written=[prefix]), IndexedWriter(output_prefix, tokenizer["vocab_size"]) \
            as writer:
        for info in infos:
            writer.add_dataset(info.prefix, info.documents, info.tokens)
            if bar is not None:
                bar.update(info.tokens)
        meta = _merged_meta([i.meta or {} for i in infos], prefixes)
        writer.commit(meta)
    if bar is not None:
        bar.close()
    meta.update(documents=writer.documents, tokens=writer.tokens, seconds=time.perf_counter() - start)
    return meta


def _merged_meta(metas: list[dict], prefixes: list[str]) -> dict:
    skipped: dict[str, int] = {}
    for m in metas:
        for kind, n in (m.get("skipped_lines") or {}).items():
            skipped[kind] = skipped.get(kind, 0) + n
    return {
        "tokenizer": metas[0]["tokenizer"],
        "append_eod": metas[0].get("append_eod"),
        "text_key": metas[0].get("text_key"),
        "inputs": [path for m in metas for path in m.get("inputs", [])],
        "merged_from": [os.path.abspath(p) for p in prefixes],
        "skipped_lines": dict(sorted(skipped.items())),
        "empty_documents": sum(m.get("empty_documents", 0) for m in metas),
    }


def _bar(total: int, enabled: bool) -> Optional[object]:
    if not enabled:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="tok", unit_scale=True, desc="merge", dynamic_ncols=True)
