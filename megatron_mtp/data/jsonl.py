"""Reading JSONL corpora (plain, gzip or zstd) as chunks of raw lines, and parsing one line into text.

Reading and parsing are split on purpose: the main process only cuts files into chunks of raw
byte lines (cheap), and the workers decode UTF-8, parse JSON and tokenise (expensive). A chunk
remembers its file and first line number, so every problem is reported as ``file:line``.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import BinaryIO, Callable, Optional, Union

from megatron_mtp.errors import UserError

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

# Kinds of bad lines (used as keys of the skipped-line counts).
BAD_JSON = "malformed JSON"
BAD_UTF8 = "non-UTF-8 bytes"
MISSING_KEY = "missing text key"
BAD_TYPE = "text is not a string"
BAD_UNICODE = "invalid Unicode in text"
TOO_LONG = "document too long"

LINE_LIMIT_FACTOR = 8
"""A JSONL line may be this many times --max-document-bytes (JSON escapes such as \\u00e9 make a line
longer than its text); a longer one is not held in memory at all, only measured and reported."""


class LongLine:
    """Stands for a JSONL line too long to read (its length, not its bytes)."""

    __slots__ = ("size",)

    def __init__(self, size: int):
        self.size = size

    def __len__(self) -> int:
        return self.size


@dataclass
class Chunk:
    """Consecutive raw lines of one JSONL file, or consecutive rows' texts of one table file."""

    file_index: int
    first_line: int
    """1-based line (or row) number of the chunk's first line (row)."""
    lines: list[bytes]
    texts: Optional[list] = field(default=None)
    """A table file's texts (None for a null value); then `lines` is empty."""
    nbytes: int = 0
    """A table chunk's text bytes."""


@dataclass
class BadLine:
    """One line that could not be turned into a document."""

    file_index: int
    line: int
    kind: str
    detail: str


def needs_extra(module: str, what: str) -> UserError:
    """The sentence for a corpus format whose reader is not installed (the `corpus` extra)."""
    return UserError(f"{what} needs the '{module}' package, which is not installed; install it with "
                     f"pip install 'megatron-mtp[corpus]'")


def sniff(path: Union[str, os.PathLike]) -> bytes:
    """The first bytes of an input file (after checking it exists and is a file)."""
    if not os.path.exists(path):
        raise UserError(f"input file '{path}' does not exist")
    if not os.path.isfile(path):
        raise UserError(f"input '{path}' is not a file")
    with open(path, "rb") as fh:
        return fh.read(8)


def open_input(path: Union[str, os.PathLike]) -> tuple[BinaryIO, BinaryIO]:
    """(line stream, raw file) for a plain, gzip or zstd file; the raw file's tell() measures progress."""
    head = sniff(path)
    raw = open(path, "rb")
    if head[:2] == GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb"), raw  # type: ignore[return-value]
    if head[:4] == ZSTD_MAGIC:
        try:
            import zstandard
        except ImportError:
            raw.close()
            raise needs_extra("zstandard", f"reading the zstd file '{path}'") from None
        return io.BufferedReader(_ZstdFrames(raw, zstandard), 1 << 20), raw  # type: ignore[return-value]
    return raw, raw


class _ZstdFrames(io.RawIOBase):
    """The decompressed bytes of a zstd file of one or more frames (as `zstd -T` and pzstd write);
    unlike zstandard's stream_reader, a file that ends inside a frame (truncated) raises ZstdError."""

    def __init__(self, raw: BinaryIO, zstandard):
        self._raw, self._zstd = raw, zstandard
        self._dctx = zstandard.ZstdDecompressor()
        self._obj = self._dctx.decompressobj()
        self._in_frame = False
        self._buf = b""

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        while not self._buf:
            block = self._raw.read(1 << 20)
            if not block:
                if self._in_frame:
                    raise self._zstd.ZstdError("the file ends inside a zstd frame (truncated)")
                return 0
            out = []
            while block:
                if self._obj.eof:
                    self._obj = self._dctx.decompressobj()
                out.append(self._obj.decompress(block))
                block = self._obj.unused_data if self._obj.eof else b""
            self._in_frame = not self._obj.eof
            self._buf = b"".join(out)
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n


def damage_errors() -> tuple:
    """The exceptions a damaged gzip or zstd stream raises while it is read (zstd: only with the extra)."""
    errors: tuple = (OSError, EOFError, zlib.error)
    try:
        import zstandard

        errors += (zstandard.ZstdError,)
    except ImportError:
        pass
    return errors


def iter_file_chunks(index: int, path: str, chunk_bytes: int = 1 << 18,
                     progress: Optional[Callable[[int], None]] = None, max_line: Optional[int] = None
                     ) -> Iterator[Chunk]:
    """Chunks of about ``chunk_bytes`` raw lines of one JSONL file, then an empty Chunk (its end marker).

    ``progress(n)`` is called with the number of (compressed) input bytes consumed since the last call.
    A line longer than ``max_line`` bytes is read in pieces and given as a `LongLine` (memory stays bounded).
    """
    stream, raw = open_input(path)
    last_pos = 0
    first = 1  # line number of lines[0]
    lines: list[bytes] = []
    size = 0
    try:
        for line in _lines(stream, max_line):
            lines.append(line)
            size += len(line)
            if size >= chunk_bytes:
                yield Chunk(index, first, lines)
                first, lines, size = first + len(lines), [], 0
                if progress is not None:
                    pos = raw.tell()
                    progress(pos - last_pos)
                    last_pos = pos
    except damage_errors() as exc:
        what = "zstd" if sniff(path)[:4] == ZSTD_MAGIC else "gzip"
        raise UserError(
            f"input file '{path}' is a damaged {what} file (reading failed after line "
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


def _lines(stream: BinaryIO, max_line: Optional[int]) -> Iterator[Union[bytes, LongLine]]:
    if max_line is None:
        yield from stream
        return
    while True:
        line = stream.readline(max_line + 1)
        if not line:
            return
        if len(line) <= max_line:
            yield line
            continue
        size = len(line)
        while not line.endswith(b"\n"):  # the rest of the line, a piece at a time
            line = stream.readline(1 << 20)
            if not line:
                break
            size += len(line)
        yield LongLine(size)


def parse_line(line: Union[bytes, LongLine], text_key: str) -> Union[str, tuple[str, str], None]:
    """The text of one JSONL line, None for a blank line, or (kind, detail) when the line is bad."""
    if isinstance(line, LongLine):
        return TOO_LONG, (f"the line is {line.size:,} bytes, more than {LINE_LIMIT_FACTOR} times "
                          "--max-document-bytes, so it was not read; raise --max-document-bytes or split the "
                          "document")
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
