"""Reading JSONL corpora (plain or gzip) as chunks of raw lines, and parsing one line into text.

Reading and parsing are split on purpose: the main process only cuts files into chunks of raw
byte lines (cheap), and the workers decode UTF-8, parse JSON and tokenise (expensive). A chunk
remembers its file and first line number, so every problem is reported as ``file:line``.
"""

from __future__ import annotations

import gzip
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO, Optional, Union

from megatron_mtp.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"

# Kinds of bad lines (used as keys of the skipped-line counts).
BAD_JSON = "malformed JSON"
BAD_UTF8 = "non-UTF-8 bytes"
MISSING_KEY = "missing text key"
BAD_TYPE = "text is not a string"
BAD_UNICODE = "invalid Unicode in text"


@dataclass
class Chunk:
    """Consecutive raw lines of one input file."""

    file_index: int
    first_line: int
    """1-based line number of ``lines[0]``."""
    lines: list[bytes]


@dataclass
class BadLine:
    """One line that could not be turned into a document."""

    file_index: int
    line: int
    kind: str
    detail: str


def open_input(path: Union[str, os.PathLike]) -> tuple[BinaryIO, BinaryIO]:
    """(line stream, raw file) for a plain or gzip file; the raw file's tell() measures progress."""
    if not os.path.exists(path):
        raise UserError(f"input file '{path}' does not exist")
    if not os.path.isfile(path):
        raise UserError(f"input '{path}' is not a file")
    raw = open(path, "rb")
    if raw.read(2) == GZIP_MAGIC:
        raw.seek(0)
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    raw.seek(0)
    return raw, raw


def iter_chunks(
    paths: list[str], chunk_bytes: int = 1 << 18, progress: Optional[callable] = None
) -> Iterator[Chunk]:
    """Yield chunks of about ``chunk_bytes`` raw lines, file by file, in order.

    ``progress(n)`` is called with the number of (compressed) input bytes consumed since the last call.
    A file that ends (after zero or more chunks) yields a Chunk with no lines as an end marker,
    so the consumer can tell when a file is finished.
    """
    for index, path in enumerate(paths):
        stream, raw = open_input(path)
        last_pos = 0
        first = 1  # line number of lines[0]
        lines: list[bytes] = []
        size = 0
        try:
            for line in stream:
                lines.append(line)
                size += len(line)
                if size >= chunk_bytes:
                    yield Chunk(index, first, lines)
                    first, lines, size = first + len(lines), [], 0
                    if progress is not None:
                        pos = raw.tell()
                        progress(pos - last_pos)
                        last_pos = pos
        except (OSError, EOFError, zlib.error) as exc:
            raise UserError(
                f"input file '{path}' is a damaged gzip file (reading failed after line "
                f"{first + len(lines) - 1}: {exc}); re-create or re-download it"
            ) from None
        finally:
            stream.close()
            raw.close()
        if lines:
            yield Chunk(index, first, lines)
        if progress is not None:
            progress(os.path.getsize(path) - last_pos)
        yield Chunk(index, first + len(lines), [])


def parse_line(line: bytes, text_key: str) -> Union[str, tuple[str, str], None]:
    """The text of one JSONL line, None for a blank line, or (kind, detail) when the line is bad."""
    try:
        decoded = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        bad = line[exc.start:exc.start + 1]
        return BAD_UTF8, f"the line holds bytes that are not UTF-8 (byte {exc.start}: {bad!r})"
    if not decoded.strip():
        return None
    try:
        obj = json.loads(decoded)
    except json.JSONDecodeError as exc:
        return BAD_JSON, f"the line is not valid JSON ({exc.msg} at column {exc.colno})"
    if not isinstance(obj, dict):
        return BAD_JSON, f"the line is a JSON {type(obj).__name__}, not an object with a '{text_key}' key"
    if text_key not in obj:
        keys = ", ".join(sorted(map(str, obj))[:8]) or "none"
        return MISSING_KEY, f"the object has no '{text_key}' key (keys: {keys}); pick the right one with --text-key"
    text = obj[text_key]
    if not isinstance(text, str):
        return BAD_TYPE, f"the '{text_key}' value is a {type(text).__name__}, not a string"
    return text


def is_jsonl_name(path: Union[str, os.PathLike]) -> bool:
    """True for *.jsonl / *.json names (optionally .gz): such files hold one JSON document per line."""
    name = os.fspath(path).lower()
    if name.endswith(".gz"):
        name = name[:-3]
    return name.endswith((".jsonl", ".json"))


def iter_texts(paths: list[str], text_key: str = "text") -> Iterator[str]:
    """Documents of the given files in order: JSONL files give one text per line, others one per file.

    Bad JSONL lines raise UserError naming file and line (used for tokenizer training, where a
    silently skipped line would go unnoticed).
    """
    for path in paths:
        if is_jsonl_name(path):
            for chunk in iter_chunks([path]):
                for offset, raw in enumerate(chunk.lines):
                    parsed = parse_line(raw, text_key)
                    if isinstance(parsed, tuple):
                        raise UserError(f"{path}:{chunk.first_line + offset}: {parsed[1]}; fix the line")
                    if parsed:
                        yield parsed
        else:
            stream, raw = open_input(path)
            try:
                data = stream.read()
            except (OSError, EOFError, zlib.error) as exc:
                raise UserError(f"input file '{path}' is a damaged gzip file ({exc}); re-create it") from None
            finally:
                stream.close()
                raw.close()
            try:
                yield data.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = data.count(b"\n", 0, exc.start) + 1
                raise UserError(f"{path}:{line}: the file holds bytes that are not UTF-8; "
                                "convert it to UTF-8") from None
