"""Streaming writer of megatron-core ``torch_dist`` checkpoints from a single process.

Writes the same on-disk format ``megatron.core.dist_checkpointing.save`` produces (one
``__0_0.distcp`` file of ``torch.save`` blobs, a pickled ``torch.distributed.checkpoint.Metadata``
in ``.metadata``, megatron's ``metadata.json`` and ``common.pt``) without a model or process group,
one chunk at a time: a tensor may be written as several chunks (the converter writes routed experts
one expert per chunk, as the trainer does), so memory stays bounded by one chunk. Because chunks
carry global offsets, the result loads at any TP/PP/EP layout.
"""

from __future__ import annotations

import io
import json
import os
import pickle
from pathlib import Path
from typing import Any

import torch

DATA_FILE = "__0_0.distcp"


class TorchDistWriter:
    def __init__(self, out_dir: str | os.PathLike) -> None:
        from torch.distributed.checkpoint.metadata import TensorProperties, TensorStorageMetadata

        self._TensorProperties = TensorProperties
        self._TensorStorageMetadata = TensorStorageMetadata
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._fh = open(self.out_dir / DATA_FILE, "wb")
        self._state: dict[str, Any] = {}
        self._storage: dict[Any, Any] = {}
        self._covered: dict[str, int] = {}

    def declare(self, key: str, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        """Announce a global tensor; its chunks follow with ``write_chunk``."""
        if key in self._state:
            raise ValueError(f"{key} declared twice")
        self._state[key] = self._TensorStorageMetadata(
            properties=self._TensorProperties(dtype=dtype), size=torch.Size(shape), chunks=[]
        )
        self._covered[key] = 0

    def write_chunk(self, key: str, offsets: tuple[int, ...], tensor: torch.Tensor) -> None:
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

        meta = self._state[key]
        if tensor.dtype != meta.properties.dtype or tensor.dim() != len(meta.size):
            raise ValueError(f"chunk of {key}: {tensor.dtype}/{tensor.dim()}-d does not match the declaration")
        tensor = tensor.detach().contiguous()
        if tensor.untyped_storage().nbytes() != tensor.numel() * tensor.element_size():
            tensor = tensor.clone()  # torch.save writes the whole storage of a view
        start = self._fh.tell()
        torch.save(tensor, self._fh)
        length = self._fh.tell() - start
        offsets_size = torch.Size(offsets)
        meta.chunks.append(ChunkStorageMetadata(offsets=offsets_size, sizes=tensor.shape))
        self._storage[MetadataIndex(key, offsets_size, len(meta.chunks) - 1)] = _StorageInfo(DATA_FILE, start, length)
        self._covered[key] += tensor.numel()

    def copy_chunk_blob(self, key: str, offsets: tuple[int, ...], sizes: tuple[int, ...], blob: bytes) -> None:
        """Append a chunk already serialised by torch.save (copied verbatim from another checkpoint)."""
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex

        meta = self._state[key]
        start = self._fh.tell()
        self._fh.write(blob)
        offsets_size = torch.Size(offsets)
        meta.chunks.append(ChunkStorageMetadata(offsets=offsets_size, sizes=torch.Size(sizes)))
        self._storage[MetadataIndex(key, offsets_size, len(meta.chunks) - 1)] = _StorageInfo(
            DATA_FILE, start, len(blob)
        )
        self._covered[key] += int(torch.Size(sizes).numel())

    def write_tensor(self, key: str, tensor: torch.Tensor) -> None:
        self.declare(key, tuple(tensor.shape), tensor.dtype)
        self.write_chunk(key, (0,) * tensor.dim(), tensor)

    def write_object(self, key: str, obj: Any) -> None:
        """A megatron ShardedObject (key already carries its ``/shard_i_n`` suffix)."""
        buf = io.BytesIO()
        torch.save(obj, buf)
        self.write_object_blob(key, buf.getvalue())

    def write_object_blob(self, key: str, blob: bytes) -> None:
        from torch.distributed.checkpoint.filesystem import _StorageInfo
        from torch.distributed.checkpoint.metadata import BytesStorageMetadata, MetadataIndex

        start = self._fh.tell()
        self._fh.write(blob)
        self._state[key] = BytesStorageMetadata()
        self._storage[MetadataIndex(key)] = _StorageInfo(DATA_FILE, start, self._fh.tell() - start)

    def finish(self, common: dict | None = None) -> None:
        from torch.distributed.checkpoint.metadata import Metadata

        for key, meta in self._state.items():
            if key in self._covered and self._covered[key] != meta.size.numel():
                raise ValueError(f"{key}: chunks cover {self._covered[key]} of {meta.size.numel()} elements")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self._fh.close()
        metadata = Metadata(state_dict_metadata=self._state, planner_data=None, storage_data=self._storage)
        with open(self.out_dir / ".metadata", "wb") as fh:
            pickle.dump(metadata, fh)
        torch.save(common or {}, self.out_dir / "common.pt")
        (self.out_dir / "metadata.json").write_text(
            json.dumps(
                {
                    "sharded_backend": "torch_dist",
                    "sharded_backend_version": 1,
                    "common_backend": "torch",
                    "common_backend_version": 1,
                }
            )
        )

    def abort(self) -> None:
        if not self._fh.closed:
            self._fh.close()
