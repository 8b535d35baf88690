"""Corpora -> megatron-core indexed dataset (the engine behind `megatron-mtp preprocess`).

Inputs are files, directories, globs or @LIST files of JSONL (plain/gzip/zstd), Parquet or Arrow
(sources.py). With ``shard=(i, n)`` only the i-th of n contiguous blocks of the expanded file list is
tokenised, into PREFIX_shard-I-of-N (shards.py): n such runs (a Slurm array) merged in order equal
one unsharded run, byte for byte.

Pipeline: the main process cuts the input files into chunks of raw lines or table rows (sources.py),
hands them to ``workers`` tokenising processes (encode_worker) through a bounded in-order window,
and appends the returned token arrays to an IndexedWriter in input order. Because results are
consumed strictly in submission order and each document is tokenised on its own, the .bin/.idx
bytes are identical for any worker count. The window (a few chunks per worker) bounds memory
for inputs of any size. With one worker everything runs in-process.

Each JSON line becomes one document (one sequence) of the dataset; empty documents are dropped
(counted in the summary). Bad lines stop the run with ``file:line: what is wrong`` unless
``skip_bad_lines`` is set, in which case they are counted per kind and the first few reported.
"""

from __future__ import annotations

import collections
import contextlib
import multiprocessing
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Optional, Union

from megatron_mtp.data import encode_worker
from megatron_mtp.data.indexed import IndexedWriter
from megatron_mtp.data.jsonl import LINE_LIMIT_FACTOR, BadLine, Chunk
from megatron_mtp.data.shards import select_shard, shard_prefix
from megatron_mtp.data.sources import describe_row, expand_inputs, input_kind, iter_input_chunks
from megatron_mtp.data.tokenizer import Tokenizer, load_tokenizer
from megatron_mtp.errors import UserError
from megatron_mtp.write_causes import write_failures

MAX_BAD_EXAMPLES = 5
MAX_DOCUMENT_BYTES = 8 << 20
"""--max-document-bytes' default: a larger document is a bad line (tokenising 8 MiB of code takes a worker
about 1.2 GB; encode_worker.too_long)."""


@dataclass
class PreprocessStats:
    """What a preprocessing run did."""

    output_prefix: str
    documents: int = 0
    tokens: int = 0
    input_bytes: int = 0
    """Uncompressed JSONL bytes read."""
    lines: int = 0
    empty_documents: int = 0
    bad_lines: dict[str, int] = field(default_factory=dict)
    """Skipped lines per kind of problem (only with skip_bad_lines)."""
    bad_examples: list[str] = field(default_factory=list)
    """The first few skipped lines as `file:line: problem`."""
    seconds: float = 0.0

    def summary(self) -> str:
        rate = max(self.seconds, 1e-9)
        text = (
            f"wrote {self.output_prefix}.bin/.idx: {self.documents} documents, {self.tokens} tokens "
            f"in {self.seconds:.1f}s ({self.documents / rate:.0f} docs/s, {self.tokens / rate:.0f} tokens/s)"
        )
        if self.empty_documents:
            text += f"; {self.empty_documents} empty documents dropped"
        if self.bad_lines:
            counts = ", ".join(f"{n} {kind}" for kind, n in sorted(self.bad_lines.items()))
            text += f"; skipped {sum(self.bad_lines.values())} bad lines ({counts})"
            text += "".join(f"\n  e.g. {ex}" for ex in self.bad_examples)
        return text


def _describe_bad(bad: BadLine, paths: list[str], kinds: list[str]) -> str:
    return f"{describe_row(paths[bad.file_index], kinds[bad.file_index], bad.line)}: {bad.detail}"


class _InProcess:
    """The worker-pool interface, run in this process (workers=1)."""

    def __init__(self, initargs: tuple):
        encode_worker.init_worker(*initargs)

    def submit(self, chunk: Chunk):
        return encode_worker.encode_chunk(chunk)

    @staticmethod
    def result(handle):
        return handle

    def close(self) -> None:
        encode_worker._STATE.clear()


class WorkerDied(UserError, RuntimeError):
    """A worker process of the pool died; the CLI prints it as one sentence."""


class _Pool:
    """N worker processes (concurrent.futures: a dead worker raises instead of hanging).

    Linux uses fork: workers start fast and work whatever ``__main__`` is (spawn re-runs the main
    script, which fails for stdin scripts). Workers use no torch and tokenise single-threaded.
    A dead worker breaks the pool; concurrent.futures then raises BrokenProcessPool from whichever
    call comes next, ``submit`` or ``result``, so both translate it.
    """

    def __init__(self, workers: int, initargs: tuple):
        from concurrent.futures import ProcessPoolExecutor

        method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
        self._pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context(method),
                                         initializer=encode_worker.init_worker, initargs=initargs)

    @staticmethod
    @contextlib.contextmanager
    def _translated():
        from concurrent.futures.process import BrokenProcessPool

        try:
            yield
        except BrokenProcessPool:
            raise WorkerDied("a preprocessing worker process died (out of memory or killed?); re-run with fewer "
                             "--workers or a lower --max-document-bytes") from None

    def submit(self, chunk: Chunk):
        with self._translated():
            return self._pool.submit(encode_worker.encode_chunk, chunk)

    @classmethod
    def result(cls, handle):
        with cls._translated():
            return handle.result()

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


@contextlib.contextmanager
def _single_threaded_tokenizers():
    """TOKENIZERS_PARALLELISM=false while preprocessing (one core per worker; no fork warning)."""
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def preprocess(
    inputs: list[str],
    tokenizer: Union[str, Tokenizer],
    output_prefix: str,
    text_key: str = "text",
    workers: int = 1,
    append_eod: bool = False,
    skip_bad_lines: bool = False,
    progress: bool = True,
    chunk_bytes: int = 1 << 18,
    shard: Optional[tuple[int, int]] = None,
    tokenizer_backend: str = "auto",
    max_document_bytes: Optional[int] = MAX_DOCUMENT_BYTES,
) -> PreprocessStats:
    """Tokenise ``inputs`` into ``output_prefix``.bin/.idx (or its shard's prefix); see the module docstring."""
    if not inputs:
        raise UserError("no input files given; pass corpus files, directories or globs with --input")
    if workers < 1:
        raise UserError(f"--workers is {workers}; it must be at least 1")
    if max_document_bytes is not None and max_document_bytes < 1:
        raise UserError(f"--max-document-bytes is {max_document_bytes}; it must be at least 1")
    inputs = expand_inputs(list(inputs))
    if shard is not None:
        inputs = select_shard(inputs, *shard)
        output_prefix = shard_prefix(output_prefix, *shard)
    kinds = [input_kind(path) for path in inputs]  # existence and format checks before any work
    tok = load_tokenizer(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else tokenizer
    if tok.source in ("<memory>", "<trained>"):
        raise UserError("preprocess needs a tokenizer saved on disk; call Tokenizer.save(dir) and pass the directory")
    eod_id = tok.require_eod() if append_eod else None
    from megatron_mtp.data.fast_tokenizer import fast_backend

    backend, note = fast_backend(tok.backend, tokenizer_backend)  # the same tokens either way (its design note)
    if note and progress:
        print(f"preprocess: note: {note}", file=sys.stderr, flush=True)
    initargs = (tok.source, text_key, eod_id, backend, max_document_bytes)
    max_line = LINE_LIMIT_FACTOR * max_document_bytes if max_document_bytes else None

    stats = PreprocessStats(output_prefix=output_prefix)
    docs_per_file = [0] * len(inputs)
    lines_per_file = [0] * len(inputs)
    start = time.perf_counter()
    bar = None

    def on_read(nbytes: int) -> None:
        if bar is not None:
            bar.update(nbytes)

    def consume(result: encode_worker.EncodedChunk) -> None:
        path = inputs[result.file_index]
        if result.bad:
            if not skip_bad_lines:
                first = result.bad[0]
                unit = "line" if kinds[first.file_index] == "jsonl" else "row"
                raise UserError(f"{_describe_bad(first, inputs, kinds)}; fix the {unit} or pass --skip-bad-lines "
                                "to skip bad lines")
            for bad in result.bad:
                stats.bad_lines[bad.kind] = stats.bad_lines.get(bad.kind, 0) + 1
                if len(stats.bad_examples) < MAX_BAD_EXAMPLES:
                    stats.bad_examples.append(_describe_bad(bad, inputs, kinds))
        writer.add(result.tokens, result.lengths)
        stats.documents += len(result.lengths)
        stats.tokens += int(result.lengths.sum())
        stats.input_bytes += result.input_bytes
        stats.lines += result.lines
        stats.empty_documents += result.empty
        docs_per_file[result.file_index] += len(result.lengths)
        lines_per_file[result.file_index] += result.lines
        if result.lines == 0 and docs_per_file[result.file_index] == 0:  # end of a file
            unit = "lines" if kinds[result.file_index] == "jsonl" else "rows"
            what = "is empty" if lines_per_file[result.file_index] == 0 else (
                f"holds no documents (its {lines_per_file[result.file_index]} {unit} are blank, empty or bad)")
            raise UserError(f"input file '{path}' {what}; remove it from --input or fill it")
        if bar is not None:
            elapsed = max(time.perf_counter() - start, 1e-9)
            bar.set_postfix_str(
                f"{stats.documents / elapsed:.0f} docs/s, {stats.tokens / elapsed:.0f} tokens/s", refresh=False
            )

    runner = None
    writer = None
    prefix = os.path.abspath(output_prefix)
    try:
        with write_failures(prefix, "dataset", written=[prefix],
                            needed_bytes=lambda: writer.bytes_written if writer else None), \
                _single_threaded_tokenizers(), IndexedWriter(output_prefix, tok.vocab_size) as writer:
            if writer.removed_stale and progress:
                print(f"preprocess: note: removed {len(writer.removed_stale)} temporary files of an earlier run of "
                      f"{output_prefix} that was killed", file=sys.stderr, flush=True)
            runner = _InProcess(initargs) if workers == 1 else _Pool(workers, initargs)
            bar = _progress_bar(inputs, progress)
            start = time.perf_counter()
            pending: collections.deque = collections.deque()
            window = 4 * workers
            for chunk in iter_input_chunks(inputs, text_key, chunk_bytes, on_read, max_line):
                pending.append(runner.submit(chunk))
                while len(pending) > window or (workers == 1 and pending):
                    consume(runner.result(pending.popleft()))
            while pending:
                consume(runner.result(pending.popleft()))
            stats.seconds = time.perf_counter() - start
            writer.commit(_meta(tok, inputs, text_key, append_eod, stats, shard))
    finally:
        if runner is not None:
            runner.close()
        if bar is not None:
            bar.close()
    return stats


def _meta(tok: Tokenizer, inputs: list[str], text_key: str, append_eod: bool, stats: PreprocessStats,
          shard: Optional[tuple[int, int]] = None) -> dict:
    return {
        "tokenizer": {
            "path": os.path.abspath(tok.source),
            "vocab_size": tok.vocab_size,
            "eod_id": tok.eod_id,
            "bos_id": tok.bos_id,
            "fingerprint": tok.fingerprint(),
        },
        "append_eod": append_eod,
        "text_key": text_key,
        "inputs": [os.path.abspath(p) for p in inputs],
        **({"shard": list(shard)} if shard else {}),
        "skipped_lines": dict(sorted(stats.bad_lines.items())),
        "empty_documents": stats.empty_documents,
    }


def _progress_bar(inputs: list[str], enabled: bool):
    if not enabled:
        return None
    from tqdm import tqdm

    total = sum(os.path.getsize(p) for p in inputs)
    return tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="preprocess", dynamic_ncols=True)


MAX_DEFAULT_WORKERS = 32


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def default_workers() -> int:
    """Worker processes to use when the user does not say: the CPUs available, at most 32
    (past that the single reading/writing process becomes the bottleneck)."""
    return min(available_cpus(), MAX_DEFAULT_WORKERS)


def resolve_workers(workers: Optional[int]) -> int:
    return default_workers() if workers is None else workers
