"""The tokenising half of preprocessing: raw JSONL lines (or a table's texts) in, token arrays out.

Runs in worker processes (or in-process for one worker) and uses only numpy, json and
`tokenizers` (never torch), so forked workers are safe and a spawned one starts fast. Each
worker tokenises single-threaded (preprocess sets TOKENIZERS_PARALLELISM=false): parallelism
comes from the worker processes, which keeps the "N workers = N cores" accounting honest. Every
document's tokens depend only on its own text, so the output is identical for any number of
workers or chunk size.
"""

from __future__ import annotations

import itertools
import os
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

from megatron_mtp.data.jsonl import BAD_UNICODE, TOO_LONG, BadLine, Chunk, parse_line
from megatron_mtp.data.sources import parse_row


@dataclass
class EncodedChunk:
    """Tokens of the documents of one chunk, in line order."""

    file_index: int
    tokens: np.ndarray
    """All documents' token ids, concatenated (int32)."""
    lengths: np.ndarray
    """Tokens per document (int64); documents with zero tokens are dropped and counted in `empty`."""
    input_bytes: int = 0
    """Raw (uncompressed) bytes of the chunk's lines."""
    lines: int = 0
    """Raw lines in the chunk (an empty chunk marks the end of a file)."""
    bad: list[BadLine] = field(default_factory=list)
    empty: int = 0
    """Documents whose text produced no tokens (and no EOD was appended)."""


_STATE: dict = {}


def init_worker(tokenizer_path: str, text_key: str, eod_id: Optional[int], backend: str = "hf",
                max_document_bytes: Optional[int] = None) -> None:
    """Load the tokenizer once per worker process; eod_id is appended to every document when set.
    backend 'gigatoken': encode through gigatoken (checked by fast_backend before the run starts).
    A document of more than max_document_bytes UTF-8 bytes is a bad line, never tokenised (`too_long`)."""
    from tokenizers import Tokenizer as HFTokenizer

    from megatron_mtp.data.tokenizer import TOKENIZER_FILE

    file = os.path.join(tokenizer_path, TOKENIZER_FILE) if os.path.isdir(tokenizer_path) else tokenizer_path
    tok = HFTokenizer.from_file(file)
    fast = None
    if backend == "gigatoken":
        from megatron_mtp.data.fast_tokenizer import gigatoken_of

        fast = gigatoken_of(tok)
    _STATE.update(tokenizer=tok, fast=fast, text_key=text_key, eod_id=eod_id, max_bytes=max_document_bytes)


def too_long(text: str, limit: Optional[int]) -> Optional[str]:
    """Why `text` is above `limit` UTF-8 bytes, or None. A tokenizer holds many times a document's
    size while it encodes it (the HF BPE about 150 bytes per byte of source code), so one huge
    document would take a worker's memory whatever --workers is."""
    if limit is None or 4 * len(text) <= limit:
        return None
    size = len(text) if len(text) > limit else len(text.encode("utf-8", "surrogatepass"))
    if size <= limit:
        return None
    return (f"the document is {size:,} bytes, more than --max-document-bytes {limit:,} (tokenising it would take "
            "about 150 bytes of memory per byte); raise --max-document-bytes or split the document")


def encode_chunk(chunk: Chunk) -> EncodedChunk:
    """Parse and tokenise one chunk with the tokenizer loaded by init_worker."""
    tok = _STATE["tokenizer"]
    text_key: str = _STATE["text_key"]
    eod_id: Optional[int] = _STATE["eod_id"]
    texts: list[str] = []
    line_numbers: list[int] = []
    bad: list[BadLine] = []
    table = chunk.texts is not None
    for offset, raw in enumerate(chunk.texts if table else chunk.lines):
        parsed = parse_row(raw, text_key) if table else parse_line(raw, text_key)
        if parsed is None:
            continue
        if isinstance(parsed, tuple):
            bad.append(BadLine(chunk.file_index, chunk.first_line + offset, *parsed))
            continue
        why = too_long(parsed, _STATE.get("max_bytes"))
        if why is not None:
            bad.append(BadLine(chunk.file_index, chunk.first_line + offset, TOO_LONG, why))
            continue
        texts.append(parsed)
        line_numbers.append(chunk.first_line + offset)

    fast = _STATE.get("fast")
    if fast is not None:
        from megatron_mtp.data.fast_tokenizer import encode_flat

        flat_lengths = encode_flat(fast, tok, texts, eod_id, chunk.file_index, line_numbers)
        if flat_lengths is not None:
            flat, lengths, empty = flat_lengths
            input_bytes = chunk.nbytes if table else sum(map(len, chunk.lines))
            rows = len(chunk.texts) if table else len(chunk.lines)
            return EncodedChunk(chunk.file_index, flat, lengths, input_bytes, rows, bad, empty)
    try:
        encoded = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
    except Exception:  # a lone surrogate (from a "\ud800" escape) cannot cross into Rust
        encoded = []
        for text, line in zip(texts, line_numbers):
            try:
                encoded.append(tok.encode(text, add_special_tokens=False).ids)
            except Exception:
                bad.append(
                    BadLine(
                        chunk.file_index,
                        line,
                        BAD_UNICODE,
                        "the text holds an unpaired surrogate escape (e.g. \\ud800), which is not valid Unicode",
                    )
                )
                continue
        bad.sort(key=lambda b: b.line)

    if eod_id is not None:
        for ids in encoded:
            ids.append(eod_id)
    lengths = np.fromiter((len(ids) for ids in encoded), dtype=np.int64, count=len(encoded))
    empty = int((lengths == 0).sum())
    if empty:
        lengths = lengths[lengths > 0]
    flat = np.fromiter(itertools.chain.from_iterable(encoded), dtype=np.int32, count=int(lengths.sum()))
    input_bytes = chunk.nbytes if table else sum(map(len, chunk.lines))
    rows = len(chunk.texts) if table else len(chunk.lines)
    return EncodedChunk(chunk.file_index, flat, lengths, input_bytes, rows, bad, empty)
