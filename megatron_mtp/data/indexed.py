"""Writing and checking megatron-core indexed datasets (PREFIX.bin + PREFIX.idx).

Writing goes through megatron-core's own ``IndexedDatasetBuilder`` into temporary names
(``PREFIX.bin.tmp-PID-RANDOM`` ...). `IndexedWriter.commit` renames them in a fixed order — metadata,
then .bin, then .idx last, after removing any old .idx first — so the presence of PREFIX.idx
means the pair is complete, and an interrupted run never leaves a dataset that looks valid. A run
killed outright (SIGKILL, the out-of-memory killer) cannot remove its temporaries, so the next writer
of the same PREFIX removes those of writers that are gone (`remove_stale_temporaries`): a writer holds
an exclusive lock on its .bin temporary while it lives, and its PID is in the name.
Writers publishing into one directory take turns (a lock on the directory), and a writer whose
PREFIX.idx was replaced while it ran (another command wrote the same dataset) keeps that dataset
and removes its own files.

Beside the pair we write ``PREFIX.meta.json`` (tokenizer vocab size, EOD id, fingerprint, counts),
which lets config validation catch a dataset tokenised with a different tokenizer.

`check_indexed_pair` validates an existing pair without trusting it: header, version, dtype,
the .idx size implied by its counts, and the .bin size implied by the sequence lengths.
"""

from __future__ import annotations

import glob
import json
import os
import re
import secrets
import struct
import warnings
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

from megatron_mtp.errors import UserError
from megatron_mtp.output import check_not_replaced, directory_lock, file_identity
from megatron_mtp.runtime.file_lock import held_by_another, try_hold
from megatron_mtp.runtime.liveness import pid_alive

INDEX_HEADER = b"MMIDIDX\x00\x00"
META_SUFFIX = ".meta.json"
# DType codes of megatron.core.datasets.indexed_dataset.DType.
_DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def _indexed_dataset_module():
    """megatron.core.datasets.indexed_dataset, imported quietly (megatron-core warns about TE/Apex)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset
    return indexed_dataset


def token_dtype(vocab_size: int) -> type:
    """The token dtype megatron-core picks for a vocabulary (uint16 below 65500 ids, else int32)."""
    return _indexed_dataset_module().DType.optimal_dtype(vocab_size)


class IndexedWriter:
    """Append documents to a new indexed dataset; `commit` publishes it, `abort` removes all traces."""

    def __init__(self, prefix: str, vocab_size: int):
        self.prefix = prefix
        if os.path.isdir(prefix):
            raise UserError(
                f"output prefix '{prefix}' is a directory; "
                f"pass a path prefix such as '{os.path.join(prefix, 'corpus')}'"
            )
        self._parent = os.path.dirname(os.path.abspath(prefix))
        os.makedirs(self._parent, exist_ok=True)
        self._seen = file_identity(prefix + ".idx")  # what a re-run replaces; anything else is another writer's
        self.removed_stale = remove_stale_temporaries(prefix)
        """Temporary files of killed writers of this prefix, removed now."""
        tag = f".tmp-{os.getpid()}-{secrets.token_hex(4)}"
        self._tmp = {ext: f"{prefix}{ext}{tag}" for ext in (".bin", ".idx", META_SUFFIX)}
        module = _indexed_dataset_module()
        self.dtype = module.DType.optimal_dtype(vocab_size)
        self._builder = module.IndexedDatasetBuilder(self._tmp[".bin"], dtype=self.dtype)
        data_file = getattr(self._builder, "data_file", None)  # "alive", for remove_stale_temporaries
        if data_file is not None:
            try_hold(data_file.fileno())  # a file system without locks: the PID alone tells
        self.documents = 0
        self.tokens = 0
        self._aborted_bytes = 0
        self._done = False

    def add(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Add documents given as one concatenated token array and the length of each document."""
        start = 0
        for length in lengths.tolist():
            self._builder.add_document(tokens[start : start + length], [length])
            start += length
        self.documents += len(lengths)
        self.tokens += start

    def add_dataset(self, prefix: str, documents: int, tokens: int) -> None:
        """Append a whole indexed dataset of this writer's dtype (megatron-core's add_index)."""
        self._builder.add_index(prefix)
        self.documents += documents
        self.tokens += tokens

    def commit(self, meta: dict[str, Any]) -> None:
        """Write the index and metadata, then rename everything into place (.idx last)."""
        self._builder.finalize(self._tmp[".idx"])
        meta = {"format": "megatron_mtp.indexed_dataset/1", "documents": self.documents, "tokens": self.tokens,
                "dtype": np.dtype(self.dtype).name, **meta}
        with open(self._tmp[META_SUFFIX], "w", encoding="utf-8") as fh:
            json.dump(meta, fh, indent=2)
        with directory_lock(self._parent):
            check_not_replaced(self.prefix + ".idx", self._seen, self.prefix, "dataset")
            if os.path.exists(self.prefix + ".idx"):
                os.unlink(self.prefix + ".idx")
            for ext in (META_SUFFIX, ".bin", ".idx"):
                os.replace(self._tmp[ext], self.prefix + ext)
        self._done = True

    @property
    def bytes_written(self) -> int:
        """Bytes of the .bin so far (after a failure: what it had put on disk before `abort`)."""
        try:
            return os.path.getsize(self._tmp[".bin"])
        except OSError:
            return self._aborted_bytes

    def abort(self) -> None:
        """Close and delete the temporary files (safe to call more than once)."""
        if self._done:
            return
        try:
            self._builder.data_file.close()
        except Exception:
            pass
        self._aborted_bytes = self.bytes_written
        for path in self._tmp.values():
            try:
                os.unlink(path)
            except OSError:
                pass
        self._done = True

    def __enter__(self) -> "IndexedWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or not self._done:
            self.abort()


_TMP_RE = re.compile(r"\.tmp-(\d+)-[0-9a-f]{8}$")


def remove_stale_temporaries(prefix: str) -> list[str]:
    """Remove PREFIX.{bin,idx,meta.json}.tmp-PID-RANDOM files whose writer is gone (its PID is not a live
    process here and no one holds its lock); returns the paths removed."""
    groups: dict[str, list[str]] = {}
    for ext in (".bin", ".idx", META_SUFFIX):
        for path in glob.glob(glob.escape(prefix + ext) + ".tmp-*"):
            match = _TMP_RE.search(path)
            if match:
                groups.setdefault(match.group(0), []).append(path)
    removed = []
    for tag, paths in groups.items():
        pid = int(_TMP_RE.search(tag).group(1))
        if pid == os.getpid() or pid_alive(pid) or held_by_another(prefix + ".bin" + tag):
            continue
        for path in paths:
            try:
                os.unlink(path)
                removed.append(path)
            except OSError:
                pass
    return sorted(removed)


@dataclass
class IndexInfo:
    """What an .idx says about its dataset."""

    prefix: str
    dtype: type
    sequences: int
    documents: int
    tokens: int
    meta: Optional[dict]
    """PREFIX.meta.json when present."""


def read_meta(prefix: str) -> Optional[dict]:
    path = prefix + META_SUFFIX
    if not os.path.isfile(path):
        return None
    try:
        with open(path, encoding="utf-8") as fh:
            meta = json.load(fh)
    except (OSError, ValueError) as exc:
        raise UserError(
            f"dataset metadata '{path}' is unreadable ({exc}); delete it or re-run `megatron-mtp preprocess`"
        ) from None
    return meta if isinstance(meta, dict) else None


def check_indexed_pair(prefix: str) -> IndexInfo:
    """Validate PREFIX.bin/PREFIX.idx without trusting them; UserError when missing or mismatched."""
    redo = "re-run `megatron-mtp preprocess` to rebuild it"
    for suffix in (".bin", ".idx"):
        if prefix.endswith(suffix):
            raise UserError(
                f"dataset prefix '{prefix}' ends with '{suffix}'; "
                f"give the prefix without the extension ('{prefix[: -len(suffix)]}')"
            )
    idx_path, bin_path = prefix + ".idx", prefix + ".bin"
    missing = [p for p in (bin_path, idx_path) if not os.path.isfile(p)]
    if missing:
        which = " and ".join(os.path.basename(p) for p in missing)
        raise UserError(f"dataset prefix '{prefix}' has no {which}; check the path or {redo}")
    idx_size = os.path.getsize(idx_path)
    with open(idx_path, "rb") as fh:
        head = fh.read(34)
    if len(head) < 34 or head[:9] != INDEX_HEADER:
        raise UserError(f"'{idx_path}' is not a megatron indexed-dataset index (bad header); {redo}")
    version = struct.unpack("<Q", head[9:17])[0]
    code = head[17]
    sequences, documents = struct.unpack("<QQ", head[18:34])
    if version != 1 or code not in _DTYPES:
        raise UserError(
            f"'{idx_path}' has index version {version} / dtype code {code}, "
            f"which megatron-core 0.16 cannot read; {redo}"
        )
    expected_idx = 34 + sequences * (4 + 8) + documents * 8
    if idx_size != expected_idx:
        raise UserError(
            f"'{idx_path}' is {idx_size} bytes but its header describes {expected_idx} (truncated or corrupt); {redo}"
        )
    lengths = np.fromfile(idx_path, dtype=np.int32, count=sequences, offset=34)
    pointers = np.fromfile(idx_path, dtype=np.int64, count=sequences, offset=34 + 4 * sequences)
    doc_idx = np.fromfile(idx_path, dtype=np.int64, count=documents, offset=34 + 12 * sequences)
    if documents == 0 or doc_idx[0] != 0 or doc_idx[-1] != sequences:
        raise UserError(f"'{idx_path}' has an inconsistent document index; {redo}")
    itemsize = np.dtype(_DTYPES[code]).itemsize
    tokens = int(lengths.astype(np.int64).sum())
    bin_size = os.path.getsize(bin_path)
    if bin_size != tokens * itemsize or (sequences and pointers[-1] + int(lengths[-1]) * itemsize != bin_size):
        raise UserError(
            f"'{bin_path}' holds {bin_size} bytes but '{idx_path}' describes {tokens * itemsize}: the .bin/.idx pair "
            f"does not match (mixed from two runs or truncated); {redo}"
        )
    return IndexInfo(prefix, _DTYPES[code], int(sequences), int(documents) - 1, tokens, read_meta(prefix))
