"""`data.paths` at corpus scale: an entry is a dataset prefix, a glob over prefixes, or @FILE.

- `corpus/fineweb_shard-*` names every prefix whose `.idx` the glob matches (sorted), e.g. the
  shards of a sharded preprocess, unmerged. Shards a glob matches must be complete, 0..N-1 of their
  `-of-N` (merge-datasets' rule): a missing one (a preprocess not finished) is an error naming it.
- `@blend.txt` (or `blend.txt`: a file that is not a dataset prefix; YAML needs `'@...'` quoted)
  reads prefixes from a file, one per line, each optionally preceded by its weight
  (`0.3 /data/fineweb`, Megatron-LM's data-path style; all lines weighted or none; `#` comments;
  relative prefixes are relative to the file). A line may itself be a glob.

Weights: `data.weights` keeps one weight per entry. An entry that expands to several prefixes shares
its weight among them in proportion to their weights in the list file, or else to their token
counts, so "these 5,000 shards are 30 % of the blend" is one entry and one weight. With
`data.weights` null, a blend given wholly by weighted list files takes their weights; otherwise
every dataset is weighted by its size (megatron-core's rule).
"""

from __future__ import annotations

import glob
import math
import os
from typing import Optional

from megatron_mtp.data.shards import missing_shards
from megatron_mtp.errors import UserError

CORPUS_NAMES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd", ".parquet",
                ".arrow", ".gz", ".zst")
"""Names of corpus files: an entry naming one was given where its tokenised dataset belongs."""


def expand_blend(entries: list[str], weights: Optional[list[float]], name: str
                 ) -> tuple[list[str], Optional[list[float]]]:
    """(absolute prefixes, their weights or None) of the entries (`name`: the field or flag, for errors)."""
    if weights is not None and len(weights) != len(entries):
        raise UserError(f"data.{'valid_weights' if name.endswith('valid_paths') else 'weights'} has {len(weights)} "
                        f"entries but {name} has {len(entries)}; give one weight per entry")
    groups = [_expand_entry(entry, name) for entry in entries]
    prefixes = [p for group in groups for p, _ in group]
    seen: dict[str, int] = {}
    for p in prefixes:
        seen[p] = seen.get(p, 0) + 1
        if seen[p] == 2:
            raise UserError(f"{name} names the dataset '{p}' twice (through its entries); name it once, "
                            "or raise its weight instead")
    weighted = [all(w is not None for _, w in group) for group in groups]
    if weights is None:
        if all(weighted):
            return prefixes, [w for group in groups for _, w in group]
        if any(weighted):
            raise UserError(f"{name} mixes weighted @list files with entries without weights; set "
                            "data.weights (one per entry) or weight every dataset in the list files")
        return prefixes, None
    out: list[float] = []
    for group, weight, has in zip(groups, weights, weighted):
        inner = [w for _, w in group] if has else [_tokens(p) for p, _ in group]
        total = sum(inner)
        out += [weight * w / total if total > 0 else 0.0 for w in inner]
    return prefixes, out


def _tokens(prefix: str) -> float:
    from megatron_mtp.data.indexed import check_indexed_pair

    return float(check_indexed_pair(prefix).tokens)


def _expand_entry(entry: str, name: str, base: Optional[str] = None, depth: int = 0
                  ) -> list[tuple[str, Optional[float]]]:
    path = os.path.expanduser(entry)
    if base is not None and not os.path.isabs(path):
        path = os.path.join(base, path)
    if entry.startswith("@"):
        return _expand_list(entry[1:], name, depth)
    lower = path.lower()
    if lower.endswith(CORPUS_NAMES) and os.path.isfile(path):
        raise UserError(f"{name} entry '{entry}' is a corpus file, not a dataset prefix; tokenise it first "
                        f"(megatron-mtp preprocess --input {entry} --tokenizer TOKENIZER --output-prefix PREFIX) "
                        "and give PREFIX")
    for suffix in (".bin", ".idx"):
        if lower.endswith(suffix) and not glob.has_magic(path):
            raise UserError(f"{name} entry '{entry}' ends with '{suffix}'; give the dataset prefix without the "
                            f"extension ('{entry[: -len(suffix)]}')")
    if os.path.isfile(path) and not os.path.isfile(path + ".idx"):
        return _expand_list(path, name, depth)  # a list file named without its '@'
    if glob.has_magic(path):
        found = sorted(m[: -len(".idx")] for m in glob.glob(path + ".idx", recursive=True))
        if not found:
            raise UserError(f"{name} entry '{entry}' matches no dataset (no '{entry}.idx'); check the pattern")
        missing = missing_shards(found)
        if missing:
            raise UserError(f"{name} entry '{entry}' matches the shards of a sharded preprocess, but {missing}; "
                            "finish its preprocess (--shard I/N) or name the shards you mean without a glob")
        return [(os.path.abspath(p), None) for p in found]
    return [(os.path.abspath(path), None)]


def _expand_list(list_file: str, name: str, depth: int) -> list[tuple[str, Optional[float]]]:
    if depth > 4:
        raise UserError(f"{name} @{list_file}: list files nest more than 4 deep (a list naming itself?)")
    try:
        with open(os.path.expanduser(list_file), encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise UserError(f"{name} @{list_file}: the list file cannot be read ({exc.strerror})") from None
    base = os.path.dirname(os.path.abspath(os.path.expanduser(list_file)))
    out: list[tuple[str, Optional[float]]] = []
    kinds = set()
    for number, line in enumerate(lines, 1):
        fields = line.split("#", 1)[0].split()
        if not fields:
            continue
        weight = None
        if len(fields) == 2:
            try:
                weight = float(fields[0])
            except ValueError:
                weight = math.nan
            if not math.isfinite(weight) or weight < 0:
                raise UserError(f"{list_file}:{number}: '{fields[0]}' is not a weight; write 'WEIGHT PREFIX' "
                                "with a non-negative number, or the prefix alone")
        elif len(fields) != 1:
            raise UserError(f"{list_file}:{number}: write 'WEIGHT PREFIX' or 'PREFIX' (paths with spaces are "
                            "not supported)")
        kinds.add(weight is not None)
        expanded = _expand_entry(fields[-1], name, base, depth + 1)
        if weight is not None:  # a weighted glob line shares its weight by size
            sizes = [_tokens(p) for p, _ in expanded]
            expanded = [(p, weight * s / sum(sizes) if sum(sizes) > 0 else 0.0) for (p, _), s in zip(expanded, sizes)]
        out += expanded
    if not out:
        raise UserError(f"{name} @{list_file}: the list file names no datasets")
    if len(kinds) > 1:
        raise UserError(f"{name} @{list_file}: some lines carry a weight and some do not; weight all or none")
    return out
