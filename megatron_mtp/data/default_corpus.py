"""The embedded default corpus: this Python's standard-library source, tokenised on first use.

Every machine that runs this project has the Python standard library, so a new user with no data
still trains on real code. Recipe (bump RECIPE_VERSION whenever any of it changes):

- Files: every ``*.py`` under ``sysconfig.get_paths()["stdlib"]``, excluding test suites
  (directories ``test``, ``tests``, ``idle_test``; files ``test_*.py``), ``site-packages``,
  ``dist-packages``, ``__pycache__``, files larger than MAX_FILE_BYTES (generated data such as
  ``pydoc_data/topics.py``) and files that are not UTF-8.
- Order and cap: files are ordered by the SHA-1 of their relative path (a deterministic shuffle
  that mixes packages) and taken until ``max_bytes`` of source (default 8 MB; CPython 3.11's
  stdlib without tests is ~12 MB). The cap keeps the first build under ~20 s on two cores.
- Split by file: a file is held out for validation when its path hash is divisible by
  VALID_EVERY (~5 % of files); at least one file is held out.
- Each file is one document, followed by ``<|end_of_text|>``.
- Tokenizer: a byte-level BPE (see tokenizer.train_bpe) trained on the train split only; or, when
  the run sets data.tokenizer (an imported model tried without preparing data), that tokenizer, the
  cache key then holding its fingerprint instead of the vocabulary size.

Cache layout: ``CACHE/default_corpus/<key>/{tokenizer/, train.bin/.idx, valid.bin/.idx,
manifest.json}``, with ``key`` a hash of (recipe version, Python version, vocab size, cap,
`tokenizers` version), so any change rebuilds in a new directory. Concurrent callers (all ranks
of a torchrun job) take an ``fcntl`` lock on ``<key>.lock``; the first builds into a temporary
directory and renames it into place, the others find it complete once they get the lock.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from megatron_mtp.data.indexed import IndexedWriter
from megatron_mtp.data.tokenizer import Tokenizer, load_tokenizer, train_bpe
from megatron_mtp.errors import UserError
from megatron_mtp.runtime.file_lock import exclusive_lock

RECIPE_VERSION = 1
DEFAULT_MAX_BYTES = 8_000_000
MAX_FILE_BYTES = 256_000
VALID_EVERY = 20
_EXCLUDED_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_MANIFEST = "manifest.json"


@dataclass(frozen=True)
class DefaultCorpus:
    """Where a built default corpus lives."""

    train_prefix: str
    valid_prefix: str
    tokenizer_dir: str
    root: str


def default_cache_dir(cache_dir: Optional[str] = None) -> str:
    """cache_dir, else $MEGATRON_MTP_CACHE, else ~/.cache/megatron_mtp."""
    return os.path.abspath(
        os.path.expanduser(cache_dir or os.environ.get("MEGATRON_MTP_CACHE") or "~/.cache/megatron_mtp")
    )


def _path_hash(rel: str) -> int:
    return int(hashlib.sha1(rel.encode("utf-8")).hexdigest()[:12], 16)


def stdlib_source_files(root: Optional[str] = None) -> list[str]:
    """Relative paths of the stdlib's non-test .py files, sorted."""
    root = root or sysconfig.get_paths()["stdlib"]
    found = []
    for directory, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _EXCLUDED_DIRS)
        for name in files:
            if name.endswith(".py") and not name.startswith("test_"):
                found.append(os.path.relpath(os.path.join(directory, name), root))
    return sorted(found)


def select_files(max_bytes: int, root: Optional[str] = None) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(train, valid) lists of (relative path, text), following the recipe in the module docstring."""
    root = root or sysconfig.get_paths()["stdlib"]
    train: list[tuple[str, str]] = []
    valid: list[tuple[str, str]] = []
    total = 0
    for rel in sorted(stdlib_source_files(root), key=lambda r: (_path_hash(r), r)):
        path = os.path.join(root, rel)
        size = os.path.getsize(path)
        if size == 0 or size > MAX_FILE_BYTES or total + size > max_bytes:
            continue
        try:
            text = Path(path).read_bytes().decode("utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        total += size
        (valid if _path_hash(rel) % VALID_EVERY == 0 else train).append((rel, text))
    if not valid and len(train) > 1:
        valid.append(train.pop())
    if not train or not valid:
        raise UserError(
            f"the Python standard library at '{root}' has too few source files for the default corpus; "
            "set data.paths to your own dataset"
        )
    return train, valid


def validation_text(max_bytes: int = DEFAULT_MAX_BYTES) -> str:
    """The held-out files' text, one blank line between files: the default corpus's validation split
    for a model with a tokenizer of its own (``eval`` of an imported model), whose special tokens
    are not this corpus's."""
    _, valid = select_files(max_bytes)
    return "\n\n".join(text for _, text in valid)


def corpus_key(vocab_size: int, max_bytes: int, fingerprint: Optional[str] = None) -> str:
    import tokenizers

    recipe = {
        **({"tokenizer": fingerprint} if fingerprint else {}),
        "recipe": RECIPE_VERSION,
        "python": list(sys.version_info[:3]),
        "implementation": sys.implementation.name,
        "vocab_size": vocab_size,
        "max_bytes": max_bytes,
        "tokenizers": tokenizers.__version__,
    }
    digest = hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:12]
    own = f"tok{fingerprint[:8]}" if fingerprint else f"v{vocab_size}"
    return f"py{sys.version_info[0]}{sys.version_info[1]}-{own}-{digest}"


def write_documents(
    texts: Iterable[str], tokenizer: Tokenizer, prefix: str, meta: dict, batch: int = 64
) -> IndexedWriter:
    """Tokenise texts (EOD appended to each) into a new indexed dataset at prefix (in-process)."""
    import numpy as np

    eod = tokenizer.require_eod()
    with IndexedWriter(prefix, tokenizer.vocab_size) as writer:
        buffer: list[str] = []

        def flush() -> None:
            ids = [seq + [eod] for seq in tokenizer.encode_batch(buffer)]
            lengths = np.array([len(s) for s in ids], dtype=np.int64)
            writer.add(np.concatenate([np.asarray(s, dtype=np.int32) for s in ids]), lengths)
            buffer.clear()

        for text in texts:
            buffer.append(text)
            if len(buffer) >= batch:
                flush()
        if buffer:
            flush()
        writer.commit(meta)
    return writer


def _corpus_paths(root: str) -> DefaultCorpus:
    return DefaultCorpus(
        os.path.join(root, "train"), os.path.join(root, "valid"), os.path.join(root, "tokenizer"), root
    )


def ensure_default_corpus(
    cache_dir: Optional[str] = None, vocab_size: int = 4096, max_bytes: int = DEFAULT_MAX_BYTES, progress: bool = True,
    tokenizer: Optional[str] = None,
) -> DefaultCorpus:
    """Return the default corpus for this Python, building it first if the cache lacks it; with
    `tokenizer` (a run's data.tokenizer), the same files tokenised with that tokenizer instead of the
    corpus's own BPE (cached by the tokenizer's fingerprint; `tokenizer_dir` is then that path).

    Safe to call from many processes at once: exactly one builds, the others wait on a file lock.
    """
    if tokenizer is not None:
        tok = load_tokenizer(tokenizer)
        tok.require_eod()
        base = os.path.join(default_cache_dir(cache_dir), "default_corpus")
        key = corpus_key(tok.vocab_size, max_bytes, tok.fingerprint())
        final = os.path.join(base, key)
        _build_locked(base, key, lambda: _build(base, key, vocab_size, max_bytes, progress, tok))
        return dataclasses.replace(_corpus_paths(final), tokenizer_dir=tokenizer)
    if vocab_size < 258:
        raise UserError(
            f"data.default_corpus_vocab_size is {vocab_size}; it must be at least 258 (256 bytes + 2 special tokens)"
        )
    base = os.path.join(default_cache_dir(cache_dir), "default_corpus")
    key = corpus_key(vocab_size, max_bytes)
    _build_locked(base, key, lambda: _build(base, key, vocab_size, max_bytes, progress))
    return _corpus_paths(os.path.join(base, key))


def _build_locked(base: str, key: str, build) -> None:
    final = os.path.join(base, key)
    if os.path.isfile(os.path.join(final, _MANIFEST)):
        return
    try:
        os.makedirs(base, exist_ok=True)
    except OSError as exc:
        raise UserError(
            f"cannot create the cache directory '{base}' ({exc.strerror}); "
            "set data.cache_dir or $MEGATRON_MTP_CACHE to a writable place"
        ) from None
    with exclusive_lock(os.path.join(base, f"{key}.lock")):
        if not os.path.isfile(os.path.join(final, _MANIFEST)):
            build()


def _build(base: str, key: str, vocab_size: int, max_bytes: int, progress: bool,
           tok: Optional[Tokenizer] = None) -> None:
    final = os.path.join(base, key)
    tmp = os.path.join(base, f".{key}.tmp-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    start = time.perf_counter()
    try:
        train, valid = select_files(max_bytes)
        nbytes = sum(len(t) for _, t in train) + sum(len(t) for _, t in valid)
        print(
            f"[megatron-mtp] building the default corpus (Python {sys.version.split()[0]} standard library: "
            f"{len(train)} train + {len(valid)} valid files, {nbytes / 1e6:.1f} MB) into {final}",
            file=sys.stderr, flush=True,
        )
        paths = _corpus_paths(tmp)
        if tok is None:  # the corpus's own BPE; a run's own tokenizer stays where it is
            train_bpe(iter([t for _, t in train]), vocab_size, paths.tokenizer_dir)
            tok = load_tokenizer(paths.tokenizer_dir)
        counts = {}
        for name, files, prefix in (("train", train, paths.train_prefix), ("valid", valid, paths.valid_prefix)):
            texts = (t for _, t in files)
            if progress:
                from tqdm import tqdm

                texts = tqdm(texts, total=len(files), desc=f"default corpus {name}", unit="file", file=sys.stderr)
            writer = write_documents(texts, tok, prefix, {"source": f"python-stdlib/{name}", "tokenizer": {
                "vocab_size": tok.vocab_size, "eod_id": tok.eod_id, "bos_id": tok.bos_id,
                "fingerprint": tok.fingerprint()}})
            counts[name] = {"files": len(files), "tokens": writer.tokens}
        manifest = {
            "recipe": RECIPE_VERSION,
            "python": sys.version.split()[0],
            "stdlib": sysconfig.get_paths()["stdlib"],
            "vocab_size": tok.vocab_size,
            "tokenizer": tok.source if tok.source != paths.tokenizer_dir else "own",
            "max_bytes": max_bytes,
            "build_seconds": round(time.perf_counter() - start, 2),
            "splits": counts,
            "valid_files": [rel for rel, _ in valid],
        }
        with open(os.path.join(tmp, _MANIFEST), "w", encoding="utf-8") as fh:
            json.dump(manifest, fh, indent=2)
        if os.path.exists(final):  # a leftover without manifest (cannot normally happen)
            shutil.rmtree(final)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"[megatron-mtp] default corpus ready in {time.perf_counter() - start:.1f}s: "
          f"{counts['train']['tokens']} train / {counts['valid']['tokens']} valid tokens", file=sys.stderr, flush=True)
