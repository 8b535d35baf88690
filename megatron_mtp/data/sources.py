"""Corpus inputs as corpora ship: which files an input names, what format each is, and its chunks.

An input (of `preprocess --input`, `tokenizer train --input`, `merge-datasets --input`) is a file, a
directory (every corpus file under it, sorted; an HF `datasets` directory saved with `save_to_disk`:
its Arrow shards in the dataset's order), a glob (`corpus/*.parquet`, `**` recurses; sorted), or
`@FILE`, a file listing such inputs one per line (blank lines and `#` comments skipped; relative
paths are relative to the list). The expanded list is what every later step, shards included, sees.

Formats, told by the file's first bytes (not its name):
- JSONL, plain, gzip or zstd (jsonl.py cuts it into chunks of raw lines; workers parse them);
- Parquet: the `--text-key` column only, streamed batch by batch (never the whole file in memory);
- Arrow IPC (stream or file format), as HF `datasets` writes its `data-*.arrow` shards: memory-mapped.
Table rows are handed to the workers as texts; a null text is a bad row (`FILE, row N: ...`), with the
same contract as a bad JSONL line. A table file written over in place while it is read (its size or
mtime changes under the open file) is one sentence, whether or not its reader fails first (an Arrow
file is memory-mapped: one cut short under the reader can still end it with SIGBUS). pyarrow
and zstandard are the `corpus` extra, imported only when a file needs them.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Iterator
from typing import Callable, Optional

from megatron_mtp.data.jsonl import BAD_TYPE, Chunk, iter_file_chunks, needs_extra, sniff
from megatron_mtp.errors import UserError

JSONL, PARQUET, ARROW = "jsonl", "parquet", "arrow"
CORPUS_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".jsonl.zstd",
                   ".parquet", ".arrow")
"""The names a directory input picks up (a directory may hold other files: READMEs, checksums)."""
ROWS_PER_BATCH = 1024


def expand_inputs(specs: list[str], flag: str = "--input") -> list[str]:
    """The files the inputs name, in order (see the module note); each file once."""
    files: list[str] = []
    origin: dict[str, str] = {}
    for spec in specs:
        for path in _expand(spec, flag, depth=0):
            key = os.path.realpath(path)
            if key in origin:
                raise UserError(f"{flag}: '{path}' is named twice (by '{origin[key]}' and '{spec}'); its documents "
                                "would be read twice, so name it once")
            origin[key] = spec
            files.append(path)
    if not files:
        raise UserError(f"{flag} names no files; pass corpus files, directories, globs or @LIST files")
    return files


def _expand(spec: str, flag: str, depth: int) -> list[str]:
    if spec.startswith("@"):
        return _expand_list(spec[1:], flag, depth)
    if glob.has_magic(spec):
        found = sorted(p for p in glob.glob(os.path.expanduser(spec), recursive=True) if os.path.isfile(p))
        if not found:
            raise UserError(f"{flag} '{spec}' matches no file; check the pattern (quote it so the shell "
                            "does not expand it)")
        return found
    path = os.path.expanduser(spec)
    if os.path.isdir(path):
        return _directory_files(path, flag)
    if not os.path.exists(path):
        raise UserError(f"input file '{spec}' does not exist")
    return [path]


def _expand_list(list_file: str, flag: str, depth: int) -> list[str]:
    if depth > 4:
        raise UserError(f"{flag} @{list_file}: list files nest more than 4 deep (a list naming itself?)")
    try:
        with open(list_file, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError as exc:
        raise UserError(f"{flag} @{list_file}: the list file cannot be read ({exc.strerror})") from None
    base = os.path.dirname(os.path.abspath(list_file))
    out: list[str] = []
    for line in lines:
        entry = line.split("#", 1)[0].strip()
        if entry:
            if not entry.startswith("@") and not os.path.isabs(os.path.expanduser(entry)):
                entry = os.path.join(base, entry)
            out += _expand(entry, flag, depth + 1)
    if not out:
        raise UserError(f"{flag} @{list_file}: the list file names no inputs")
    return out


def _directory_files(path: str, flag: str) -> list[str]:
    if os.path.isfile(os.path.join(path, "dataset_dict.json")):
        with open(os.path.join(path, "dataset_dict.json"), encoding="utf-8") as fh:
            splits = json.load(fh).get("splits", [])
        raise UserError(f"input '{path}' is an HF DatasetDict with splits {', '.join(splits)}; pass one split's "
                        f"directory, e.g. '{os.path.join(path, splits[0] if splits else 'train')}'")
    state = os.path.join(path, "state.json")
    if os.path.isfile(state):  # HF datasets' save_to_disk: its shards in the dataset's order
        with open(state, encoding="utf-8") as fh:
            names = [entry["filename"] for entry in json.load(fh).get("_data_files", [])]
        files = [os.path.join(path, name) for name in names]
        missing = [f for f in files if not os.path.isfile(f)]
        if missing or not files:
            raise UserError(f"HF dataset directory '{path}' lacks its shard {os.path.basename(missing[0])} "
                            "(see its state.json); copy the whole directory" if missing else
                            f"HF dataset directory '{path}' lists no data files in its state.json")
        return files
    found = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names
                   if name.lower().endswith(CORPUS_SUFFIXES))
    if not found:
        raise UserError(f"{flag} directory '{path}' holds no corpus files (looked for "
                        f"{', '.join(CORPUS_SUFFIXES)})")
    return found


def input_kind(path: str) -> str:
    """JSONL, PARQUET or ARROW, from the file's first bytes."""
    head = sniff(path)
    if head[:4] == b"PAR1":
        return PARQUET
    if head[:6] == b"ARROW1" or head[:4] == b"\xff\xff\xff\xff":
        return ARROW
    return JSONL


def describe_row(path: str, kind: str, line: int) -> str:
    return f"{path}:{line}" if kind == JSONL else f"{path}, row {line}"


def iter_input_chunks(paths: list[str], text_key: str, chunk_bytes: int = 1 << 18,
                      progress: Optional[Callable[[int], None]] = None, max_line: Optional[int] = None
                      ) -> Iterator[Chunk]:
    """Chunks of every input in order; each file ends with an empty Chunk (its end marker). JSONL lines
    longer than ``max_line`` bytes come as `jsonl.LongLine`s."""
    for index, path in enumerate(paths):
        kind = input_kind(path)
        if kind == JSONL:
            yield from iter_file_chunks(index, path, chunk_bytes, progress, max_line)
        else:
            yield from _table_chunks(index, path, kind, text_key, chunk_bytes, progress)


def _identity(path: str) -> tuple[int, int, int]:
    st = os.stat(path)
    return st.st_ino, st.st_size, st.st_mtime_ns


def _changed(path: str, opened: tuple[int, int, int]) -> bool:
    """Whether the file opened (inode, size, mtime) was written in place since (a file renamed over the
    path is not: the open file still reads the complete old one)."""
    try:
        now = _identity(path)
    except OSError:
        return False
    return now[0] == opened[0] and now != opened


def _table_chunks(index: int, path: str, kind: str, text_key: str, chunk_bytes: int,
                  progress: Optional[Callable[[int], None]]) -> Iterator[Chunk]:
    import pyarrow as pa

    opened = _identity(path)
    batches, rows_total = _open_table(path, kind, text_key)
    size = os.path.getsize(path)
    reported = 0
    first, texts, nbytes, row = 1, [], 0, 0
    changed = (f"input file '{path}' changed while it was read (after row {{}}: it was written over in place); "
               "re-run once it is complete and nothing writes it")
    while True:
        try:
            batch = next(batches, None)
        except (pa.ArrowException, OSError) as exc:
            if _changed(path, opened):
                raise UserError(changed.format(row)) from None
            raise UserError(f"input file '{path}' is damaged: reading past row {row} failed ({exc}); re-create or "
                            "re-download it") from None
        if _changed(path, opened):
            raise UserError(changed.format(row))
        if batch is None:
            break
        column = batch.column(0) if kind == PARQUET else batch.column(batch.schema.get_field_index(text_key))
        values = column.to_pylist()
        texts += values
        nbytes += column.nbytes
        row += len(values)
        if nbytes >= chunk_bytes:
            yield Chunk(index, first, [], texts=texts, nbytes=nbytes)
            first, texts, nbytes = row + 1, [], 0
            if progress is not None and rows_total:
                done = size * row // rows_total
                progress(done - reported)
                reported = done
    if texts:
        yield Chunk(index, first, [], texts=texts, nbytes=nbytes)
    if progress is not None:
        progress(size - reported)
    yield Chunk(index, row + 1, [])


def _open_table(path: str, kind: str, text_key: str):
    """(iterator of record batches holding the text column, row count) for a Parquet or Arrow file."""
    try:
        import pyarrow as pa
    except ImportError:
        raise needs_extra("pyarrow", f"reading the {kind.capitalize()} file '{path}'") from None
    try:
        if kind == PARQUET:
            import pyarrow.parquet as pq

            table = pq.ParquetFile(path)
            schema, rows = table.schema_arrow, table.metadata.num_rows
            _check_column(path, schema, text_key)
            return table.iter_batches(batch_size=ROWS_PER_BATCH, columns=[text_key]), rows
        source = pa.memory_map(path)
        try:
            reader = pa.ipc.open_file(source)
            # memory-mapped: a batch is a zero-copy view of the file, so holding them all costs no memory
            listed = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            batches, rows = iter(listed), sum(batch.num_rows for batch in listed)
        except pa.ArrowInvalid:
            reader = pa.ipc.open_stream(source)
            batches, rows = iter(reader), 0
        _check_column(path, reader.schema, text_key)
        return batches, rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise UserError(f"input file '{path}' is not a readable {kind.capitalize()} file ({exc}); "
                        "re-create or re-download it") from None


def _check_column(path: str, schema, text_key: str) -> None:
    import pyarrow as pa

    if text_key not in schema.names:
        names = ", ".join(schema.names[:8]) or "none"
        raise UserError(f"input file '{path}' has no column '{text_key}' (columns: {names}); pick the text "
                        "column with --text-key")
    kind = schema.field(text_key).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
        raise UserError(f"input file '{path}': column '{text_key}' holds {kind}, not strings; pick the text "
                        "column with --text-key")


def parse_row(value, text_key: str):
    """A table row's text, or (kind, detail) when it is null."""
    if value is None:
        return BAD_TYPE, f"the '{text_key}' value is null"
    return value


def is_jsonl_name(path: str) -> bool:
    """True for *.jsonl / *.json names (optionally .gz or .zst): one JSON document per line."""
    name = os.fspath(path).lower()
    for suffix in (".gz", ".zst", ".zstd"):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name.endswith((".jsonl", ".json"))


def iter_texts(paths: list[str], text_key: str = "text") -> Iterator[str]:
    """Documents of the given files in order (for tokenizer training): a JSONL file gives one text per
    line, a Parquet or Arrow file one per row, any other file is one document. A bad line or row
    raises UserError naming it (a silently skipped one would go unnoticed here)."""
    from megatron_mtp.data.jsonl import damage_errors, open_input, parse_line

    for path in paths:
        kind = input_kind(path)
        if kind != JSONL or is_jsonl_name(path):
            for chunk in iter_input_chunks([path], text_key):
                rows = chunk.texts if chunk.texts is not None else chunk.lines
                for offset, value in enumerate(rows):
                    parsed = parse_row(value, text_key) if chunk.texts is not None else parse_line(value, text_key)
                    if isinstance(parsed, tuple):
                        where = describe_row(path, kind, chunk.first_line + offset)
                        raise UserError(f"{where}: {parsed[1]}; fix the {'line' if kind == JSONL else 'row'}")
                    if parsed:
                        yield parsed
            continue
        stream, raw = open_input(path)
        try:
            data = stream.read()
        except damage_errors() as exc:
            raise UserError(f"input file '{path}' is a damaged compressed file ({exc}); re-create it") from None
        finally:
            stream.close()
            raw.close()
        try:
            yield data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise UserError(f"{path}:{line}: the file holds bytes that are not UTF-8; convert it to UTF-8") from None
