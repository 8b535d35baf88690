"""Streaming reader for megatron-core ``torch_dist`` checkpoints of any TP/PP/EP layout.

No model, no process group: the global view is already on disk. ``.metadata`` (a pickled
``torch.distributed.checkpoint.Metadata``) lists, for every global tensor, its shape, dtype and the
chunks the ranks wrote (global offsets + sizes), and ``storage_data`` maps each chunk to
(file ``__R_I.distcp``, byte offset, length); each chunk's bytes are one ``torch.save`` blob.
Reading a tensor = allocate the requested region, load each overlapping chunk blob, copy the
intersection in. Only the requested keys are touched, so optimizer state in the same files is never
read, and peak memory is the requested region plus one chunk (experts are read one at a time by
asking for a one-row region of the expert axis). ``megatron-core``'s ``metadata.json`` identifies
the backend; ``common.pt`` holds no tensors we need.

Validation happens up front, before any output is written: every referenced shard file must exist
and be long enough, the chunks of every tensor must tile it exactly, and the files read must have the
digests the checkpoint's manifest pins (checkpoint/digests.py).
"""

from __future__ import annotations

import io
import json
import math
import os
import pickle
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, Optional

import torch

from megatron_mtp.checkpoint.digests import mismatch
from megatron_mtp.checkpoint.run_dir import read_digests
from megatron_mtp.checkpoint.torch_save_blob import plain_record, read_plain_tensor
from megatron_mtp.errors import UserError


@dataclass(frozen=True)
class Chunk:
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    file: str
    offset: int
    length: int


@dataclass
class TensorEntry:
    key: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


def _load_metadata(path: Path):
    meta_file = path / ".metadata"
    if not (path / "metadata.json").is_file() or not meta_file.is_file():
        raise UserError(
            f"'{path}' is not a torch_dist checkpoint (metadata.json or .metadata is missing); "
            "pass a run directory or a checkpoints/step_N directory"
        )
    try:
        backend = json.loads((path / "metadata.json").read_text()).get("sharded_backend")
    except (OSError, ValueError):
        raise UserError(f"'{path / 'metadata.json'}' is unreadable; the checkpoint is damaged") from None
    if backend != "torch_dist":
        raise UserError(f"checkpoint '{path}' uses sharded backend '{backend}'; only torch_dist is supported")
    try:
        with open(meta_file, "rb") as fh:
            return pickle.load(fh)
    except Exception as exc:  # a truncated pickle raises anything from EOFError to UnpicklingError
        raise UserError(f"'{meta_file}' cannot be read ({type(exc).__name__}); the checkpoint is damaged") from None


class TorchDistReader:
    """Global tensors of a torch_dist checkpoint, read one region at a time."""

    def __init__(self, path: str | os.PathLike) -> None:
        from torch.distributed.checkpoint.metadata import TensorStorageMetadata

        self.path = Path(path)
        metadata = _load_metadata(self.path)
        storage: dict[str, dict[tuple[int, ...], object]] = {}
        for index, info in metadata.storage_data.items():
            if getattr(info, "transform_descriptors", None):
                raise UserError(f"checkpoint '{self.path}' uses storage transforms (compression), not supported")
            offsets = tuple(index.offset) if index.offset is not None else ()
            storage.setdefault(index.fqn, {})[offsets] = info
        self._entries: dict[str, TensorEntry] = {}
        self._objects: dict[str, tuple[str, int, int]] = {}
        for key, meta in metadata.state_dict_metadata.items():
            if not isinstance(meta, TensorStorageMetadata):
                info = storage.get(key, {}).get(())
                if info is not None:
                    self._objects[key] = (info.relative_path, info.offset, info.length)
                continue
            entry = TensorEntry(key, tuple(meta.size), meta.properties.dtype)
            for chunk in meta.chunks:
                info = storage.get(key, {}).get(tuple(chunk.offsets))
                if info is None:
                    raise UserError(
                        f"checkpoint '{self.path}' lists a chunk of '{key}' with no stored data; it is damaged"
                    )
                entry.chunks.append(
                    Chunk(tuple(chunk.offsets), tuple(chunk.sizes), info.relative_path, info.offset, info.length)
                )
            self._entries[key] = entry
        self._files: dict[str, BinaryIO] = {}

    # -- validation --------------------------------------------------------------------------
    def validate(self, keys: Optional[list[str]] = None, objects: tuple[str, ...] = (), digests: bool = True) -> None:
        """Check that the shard files of ``keys`` (default: all) exist and that chunks tile tensors, and
        (``digests``) that those files and the index have the digests the manifest pins (checkpoint/digests.py;
        a training load checks them over all its ranks instead)."""
        needed: dict[str, int] = {}
        for key in objects:
            file, offset, length = self._objects[key]
            needed[file] = max(needed.get(file, 0), offset + length)
        for key in keys if keys is not None else list(self._entries):
            entry = self.entry(key)
            covered = sum(math.prod(c.sizes) for c in entry.chunks)
            if covered != math.prod(entry.shape):
                raise UserError(
                    f"the chunks of '{key}' in '{self.path}' cover {covered} of {math.prod(entry.shape)} "
                    "elements; the checkpoint is incomplete"
                )
            for c in entry.chunks:
                needed[c.file] = max(needed.get(c.file, 0), c.offset + c.length)
        for name, end in sorted(needed.items()):
            file = self.path / name
            if not file.is_file():
                raise UserError(f"shard file '{file}' is missing; the checkpoint is incomplete")
            size = file.stat().st_size
            if size < end:
                raise UserError(
                    f"shard file '{file}' is truncated ({size} bytes, needs {end}); the checkpoint is damaged"
                )
        pinned = read_digests(self.path) if digests else None
        problem = pinned and mismatch(self.path, [".metadata", *sorted(needed)], pinned[1])
        if problem:
            raise UserError(f"checkpoint '{self.path}' is damaged: {problem}; use another checkpoint")

    # -- lookup -------------------------------------------------------------------------------
    def keys(self) -> list[str]:
        return list(self._entries)

    def __contains__(self, key: str) -> bool:
        return key in self._entries

    def entry(self, key: str) -> TensorEntry:
        try:
            return self._entries[key]
        except KeyError:
            raise UserError(f"tensor '{key}' is not in checkpoint '{self.path}'") from None

    def object_keys(self) -> list[str]:
        """Keys of stored objects (megatron ShardedObjects such as ``..._extra_state/shard_0_1``)."""
        return list(self._objects)

    # -- reading ------------------------------------------------------------------------------
    def blob(self, key: str, file: str, offset: int, length: int) -> bytes:
        """Raw bytes of one stored item (a torch.save blob)."""
        fh = self._files.get(file)
        if fh is None:
            fh = self._files[file] = open(self.path / file, "rb")
        fh.seek(offset)
        data = fh.read(length)
        if len(data) != length:
            raise UserError(f"shard file '{self.path / file}' ends inside '{key}'; the checkpoint is damaged")
        return data

    def object_blob(self, key: str) -> bytes:
        file, offset, length = self._objects[key]
        return self.blob(key, file, offset, length)

    def _file(self, name: str) -> BinaryIO:
        fh = self._files.get(name)
        if fh is None:
            fh = self._files[name] = open(self.path / name, "rb")
        return fh

    def byte_range(self, key: str, rows: Optional[tuple[int, int]] = None) -> Optional[tuple[BinaryIO, int, int]]:
        """(open file, offset, length) of the raw bytes of ``key`` (rows of axis 0) when one stored
        chunk holds them contiguously, so they can be copied file to file; None otherwise."""
        entry = self.entry(key)
        if not entry.shape:
            return None
        start, stop = rows if rows is not None else (0, entry.shape[0])
        for c in entry.chunks:
            if c.offsets[0] <= start and c.offsets[0] + c.sizes[0] >= stop and c.sizes[1:] == entry.shape[1:]:
                fh = self._file(c.file)
                found = plain_record(fh, c.offset, c.length)
                if found is None or tuple(found[0].shape) != c.sizes or found[0].dtype != entry.dtype:
                    return None
                row_bytes = math.prod(c.sizes[1:]) * entry.dtype.itemsize
                return fh, found[1] + (start - c.offsets[0]) * row_bytes, (stop - start) * row_bytes
        return None

    def is_finite(self, key: str) -> bool:
        """Whether every stored value of ``key`` is finite (checked in place where the bytes are plain)."""
        from megatron_mtp.checkpoint.finite import bytes_are_finite, tensor_is_finite

        entry = self.entry(key)
        if not entry.dtype.is_floating_point:
            return True
        for chunk in entry.chunks:
            found = plain_record(self._file(chunk.file), chunk.offset, chunk.length)
            if found is not None and found[0].dtype == entry.dtype:
                if not bytes_are_finite(self._file(chunk.file), found[1], found[0].numel() * entry.dtype.itemsize,
                                        entry.dtype):
                    return False
            elif not tensor_is_finite(self._chunk_tensor(key, chunk)):
                return False
        return True

    def _chunk_tensor(self, key: str, chunk: Chunk) -> torch.Tensor:
        fh = self._file(chunk.file)
        fast = read_plain_tensor(fh, chunk.offset, chunk.length)
        if fast is not None and tuple(fast.shape) == chunk.sizes:
            return fast
        blob = self.blob(key, chunk.file, chunk.offset, chunk.length)
        try:
            tensor = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
        except Exception as exc:
            raise UserError(
                f"a chunk of '{key}' in '{self.path / chunk.file}' cannot be decoded ({type(exc).__name__})"
            ) from None
        if not isinstance(tensor, torch.Tensor) or tuple(tensor.shape) != chunk.sizes:
            raise UserError(
                f"a chunk of '{key}' in '{self.path / chunk.file}' does not have its recorded shape {chunk.sizes}"
            )
        return tensor

    def read(self, key: str, rows: Optional[tuple[int, int]] = None) -> torch.Tensor:
        """The global tensor ``key``, or only ``[rows[0]:rows[1]]`` of its first axis."""
        entry = self.entry(key)
        start, stop = rows if rows is not None else (0, entry.shape[0] if entry.shape else 1)
        if not entry.shape:
            return self._chunk_tensor(key, entry.chunks[0]).clone()
        whole = [c for c in entry.chunks if c.offsets[0] <= start and c.offsets[0] + c.sizes[0] >= stop
                 and all(o == 0 and n == size for o, n, size in zip(c.offsets[1:], c.sizes[1:], entry.shape[1:]))]
        if whole:  # one chunk holds the whole region: no assembly copy
            c = whole[0]
            return self._chunk_tensor(key, c)[start - c.offsets[0] : stop - c.offsets[0]]
        out = torch.empty((stop - start, *entry.shape[1:]), dtype=entry.dtype)
        filled = 0
        for chunk in entry.chunks:
            c0, c1 = chunk.offsets[0], chunk.offsets[0] + chunk.sizes[0]
            lo, hi = max(start, c0), min(stop, c1)
            if lo >= hi:
                continue
            data = self._chunk_tensor(key, chunk)[lo - c0 : hi - c0]
            target = out[lo - start : hi - start]
            for dim in range(1, len(entry.shape)):
                target = target.narrow(dim, chunk.offsets[dim], chunk.sizes[dim])
            target.copy_(data)
            filled += data.numel()
        if filled != out.numel():
            raise UserError(
                f"'{key}' rows {start}:{stop} are not fully stored in '{self.path}'; the checkpoint is incomplete"
            )
        return out

    def close(self) -> None:
        for fh in self._files.values():
            fh.close()
        self._files.clear()

    def __enter__(self) -> "TorchDistReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
