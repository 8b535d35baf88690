"""Sharded safetensors writing (streamed, header planned up front) and HF directory reading.

Writer: the caller announces every tensor (name, shape, dtype) in the order it will produce them.
Shards are cut from that list, so each shard's header (which needs all offsets) is written when the
shard is opened and tensors are then appended one by one: nothing is buffered beyond the tensor in
hand. ``finish`` checks that every announced tensor arrived and writes
``model.safetensors.index.json``.

Reader: ``HFDir`` indexes an HF model directory for the converter and the decoder alike (its
index file, else every ``*.safetensors`` file in it), checks each file's header against its size (a
truncated shard is an error before any output), and returns tensors one at a time, dequantising FP8
weights with their ``_scale_inv`` blocks.
"""

from __future__ import annotations

import json
import math
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Optional

import torch

from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.fp8 import FP8_DTYPES, dequantize_blockwise

INDEX_NAME = "model.safetensors.index.json"

_DTYPE_NAMES = {
    torch.float32: "F32",
    torch.float16: "F16",
    torch.bfloat16: "BF16",
    torch.float64: "F64",
    torch.int64: "I64",
    torch.int32: "I32",
    torch.int16: "I16",
    torch.int8: "I8",
    torch.uint8: "U8",
    torch.bool: "BOOL",
}
if hasattr(torch, "float8_e4m3fn"):
    _DTYPE_NAMES[torch.float8_e4m3fn] = "F8_E4M3"
    _DTYPE_NAMES[torch.float8_e5m2] = "F8_E5M2"


@dataclass(frozen=True)
class PlannedTensor:
    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize


class ShardedSafetensorsWriter:
    """Writes announced tensors, in announced order, into ``model-0000i-of-0000n.safetensors``."""

    def __init__(self, out_dir: Path, plan: list[PlannedTensor], max_shard_bytes: int = 4 << 30) -> None:
        names = [p.name for p in plan]
        if len(set(names)) != len(names):
            dup = next(n for n in names if names.count(n) > 1)
            raise ValueError(f"tensor {dup} announced twice")
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self._shards: list[list[PlannedTensor]] = [[]]
        size = 0
        for item in plan:
            if self._shards[-1] and size + item.nbytes > max_shard_bytes:
                self._shards.append([])
                size = 0
            self._shards[-1].append(item)
            size += item.nbytes
        n = len(self._shards)
        self._files = [f"model-{i + 1:05d}-of-{n:05d}.safetensors" for i in range(n)]
        self._queue = [(shard_i, item) for shard_i, shard in enumerate(self._shards) for item in shard]
        self._pos = 0
        self._fh: Optional[BinaryIO] = None
        self._open_shard = -1
        self.total_bytes = sum(p.nbytes for p in plan)

    def _open(self, shard_i: int) -> None:
        if self._fh is not None:
            self._fh.close()
        header: dict[str, object] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for item in self._shards[shard_i]:
            header[item.name] = {
                "dtype": _DTYPE_NAMES[item.dtype],
                "shape": list(item.shape),
                "data_offsets": [offset, offset + item.nbytes],
            }
            offset += item.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._fh = open(self.out_dir / self._files[shard_i], "wb", buffering=0)
        self._fh.write(struct.pack("<Q", len(raw)))
        self._fh.write(raw)
        self._open_shard = shard_i

    def _next(self, name: str) -> PlannedTensor:
        if self._pos >= len(self._queue):
            raise ValueError(f"tensor {name} was not announced")
        shard_i, item = self._queue[self._pos]
        if item.name != name:
            raise ValueError(f"expected {item.name}, got {name}")
        if shard_i != self._open_shard:
            self._open(shard_i)
        return item

    def write(self, name: str, tensor: torch.Tensor) -> None:
        item = self._next(name)
        if tuple(tensor.shape) != item.shape or tensor.dtype != item.dtype:
            raise ValueError(
                f"expected {item.name} {item.shape} {item.dtype}, got {tuple(tensor.shape)} {tensor.dtype}"
            )
        data = memoryview(tensor.detach().contiguous().view(-1).view(torch.uint8).numpy())
        while data:
            data = data[self._fh.write(data):]
        self._pos += 1

    def copy_from(self, name: str, src: BinaryIO, offset: int, nbytes: int) -> None:
        """Append ``nbytes`` raw bytes of ``src`` at ``offset`` as tensor ``name`` (kernel-side copy)."""
        item = self._next(name)
        if nbytes != item.nbytes:
            raise ValueError(f"{name}: {nbytes} bytes given, {item.nbytes} planned")
        src_fd, dst_fd = src.fileno(), self._fh.fileno()
        done = 0
        while done < nbytes:
            try:
                n = os.copy_file_range(src_fd, dst_fd, nbytes - done, offset + done)
            except OSError:
                n = 0
            if n <= 0:  # no in-kernel copy here (other filesystem, old kernel): plain read + write
                chunk = os.pread(src_fd, min(nbytes - done, 64 << 20), offset + done)
                if not chunk:
                    raise ValueError(f"{name}: source ended after {done} of {nbytes} bytes")
                n = os.write(dst_fd, chunk)
            done += n
        self._pos += 1

    def finish(self) -> dict[str, str]:
        """Close the last shard and write the index; returns the weight map."""
        if self._pos != len(self._queue):
            missing = self._queue[self._pos][1].name
            raise ValueError(f"conversion stopped before writing {missing}")
        if self._fh is None and self._queue == []:
            self._open(0)
        if self._fh is not None:
            self._fh.close()
            self._fh = None
        weight_map = {item.name: self._files[s] for s, item in self._queue}
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2, sort_keys=True) + "\n")
        return weight_map

    def abort(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None


def _read_header(file: Path) -> dict:
    try:
        size = file.stat().st_size
        with open(file, "rb") as fh:
            head = fh.read(8)
            if len(head) != 8:
                raise ValueError
            (n,) = struct.unpack("<Q", head)
            if n > size:
                raise ValueError
            header = json.loads(fh.read(n))
    except FileNotFoundError:
        raise UserError(f"safetensors shard '{file}' is missing; the model directory is incomplete") from None
    except (ValueError, OSError):
        raise UserError(
            f"safetensors shard '{file}' has a damaged header; it is truncated or not safetensors"
        ) from None
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if size < 8 + n + end:
        raise UserError(f"safetensors shard '{file}' is truncated ({size} bytes, needs {8 + n + end})")
    return header


class HFDir:
    """Tensors of an HF model directory, by name, with FP8 block dequantisation."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        config_file = self.path / "config.json"
        if not config_file.is_file():
            raise UserError(f"'{self.path}' is not a Hugging Face model directory (no config.json)")
        try:
            self.config: dict = json.loads(config_file.read_text())
        except ValueError:
            raise UserError(f"'{config_file}' is not valid JSON") from None
        if not isinstance(self.config, dict):
            raise UserError(f"'{config_file}' must hold a JSON object")
        index_file = self.path / INDEX_NAME
        weight_map: Optional[dict[str, str]] = None
        if index_file.is_file():
            try:
                weight_map = json.loads(index_file.read_text())["weight_map"]
            except (ValueError, KeyError, TypeError):
                raise UserError(f"'{index_file}' is not a valid safetensors index (no weight_map)") from None
            files = sorted(set(weight_map.values()))
        else:
            files = sorted(f.name for f in self.path.glob("*.safetensors"))
            if not files:
                raise UserError(f"'{self.path}' holds no {INDEX_NAME} and no *.safetensors files")
        self._headers = {f: _read_header(self.path / f) for f in files}
        self.weight_map: dict[str, str] = {}
        for f, header in self._headers.items():
            for name in header:
                if name != "__metadata__":
                    self.weight_map[name] = f
        if weight_map is not None:
            for name, f in weight_map.items():
                if name not in self._headers[f]:
                    raise UserError(f"'{index_file}' lists '{name}' in '{f}', which does not hold it")
        quant = self.config.get("quantization_config") or {}
        self.block = tuple(quant.get("weight_block_size", (128, 128)))
        self._handles: dict[str, object] = {}

    def __contains__(self, name: str) -> bool:
        return name in self.weight_map

    def names(self) -> list[str]:
        """Tensor names, without the FP8 ``_scale_inv`` companions."""
        return [n for n in self.weight_map if not n.endswith("_scale_inv")]

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._headers[self.weight_map[name]][name]["shape"])

    def dtype_name(self, name: str) -> str:
        return self._headers[self.weight_map[name]][name]["dtype"]

    def dtype(self, name: str) -> torch.dtype:
        code = self.dtype_name(name)
        for dtype, dtype_code in _DTYPE_NAMES.items():
            if dtype_code == code:
                return dtype
        raise UserError(f"tensor '{name}' in '{self.path}' has unsupported dtype {code}")

    def nbytes(self, name: str) -> int:
        start, end = self._headers[self.weight_map[name]][name]["data_offsets"]
        return end - start

    def raw(self, name: str) -> torch.Tensor:
        from safetensors import safe_open

        if name not in self.weight_map:
            raise UserError(f"tensor '{name}' is missing from '{self.path}'")
        file = self.weight_map[name]
        handle = self._handles.get(file)
        if handle is None:
            handle = self._handles[file] = safe_open(str(self.path / file), framework="pt")
        return handle.get_tensor(name)

    def get(self, name: str) -> torch.Tensor:
        """The tensor in its real values: FP8 weights come back as fp32."""
        tensor = self.raw(name)
        if tensor.dtype in FP8_DTYPES:
            scale_name = name + "_scale_inv"
            if scale_name not in self.weight_map:
                raise UserError(f"FP8 tensor '{name}' in '{self.path}' has no '{scale_name}'")
            tensor = dequantize_blockwise(tensor, self.raw(scale_name), self.block, torch.float32, name)
        return tensor
