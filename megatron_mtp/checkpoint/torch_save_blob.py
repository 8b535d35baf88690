"""Reading one ``torch.save`` blob that sits at an offset inside a larger file, without copies.

torch_dist stores each chunk as a ``torch.save`` zip archive (uncompressed records) inside a
``.distcp`` file. ``torch.load(..., map_location="meta")`` on a window of the file yields the
tensor's dtype/shape/strides without reading its data; when the tensor is a plain contiguous view
of its whole little-endian storage, the storage record's bytes are read straight into the result
(one copy, kernel -> tensor, like ``cp``). Anything else returns None and the caller falls back to
a regular ``torch.load``.
"""

from __future__ import annotations

import io
import struct
import zipfile
from typing import BinaryIO, Optional

import torch


class BlobView(io.RawIOBase):
    """A read-only, seekable window [start, start + length) of an open binary file."""

    def __init__(self, fh: BinaryIO, start: int, length: int) -> None:
        super().__init__()
        self._fh, self._start, self._length, self._pos = fh, start, length, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._length}[whence]
        self._pos = max(0, min(self._length, base + offset))
        return self._pos

    def readinto(self, buffer) -> int:
        n = min(len(buffer), self._length - self._pos)
        if n <= 0:
            return 0
        self._fh.seek(self._start + self._pos)
        got = self._fh.readinto(memoryview(buffer)[:n])
        self._pos += got or 0
        return got or 0


def _record(view: BlobView, suffix: str) -> Optional[zipfile.ZipInfo]:
    with zipfile.ZipFile(view) as archive:
        for info in archive.infolist():
            if info.filename.endswith(suffix):
                return info
    return None


def _record_bytes(view: BlobView, info: zipfile.ZipInfo) -> tuple[int, int]:
    """(offset of the record's data inside the blob, its size)."""
    view.seek(info.header_offset)
    header = view.read(30)
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    return info.header_offset + 30 + name_len + extra_len, info.file_size


def read_plain_tensor(fh: BinaryIO, start: int, length: int) -> Optional[torch.Tensor]:
    """The tensor of a torch.save blob read with a single copy, or None if it is not a plain one."""
    found = plain_record(fh, start, length)
    if found is None:
        return None
    meta, offset = found
    nbytes = meta.numel() * meta.element_size()
    out = torch.empty(meta.shape, dtype=meta.dtype)
    if nbytes:
        fh.seek(offset)
        got = fh.readinto(memoryview(out.view(-1).view(torch.uint8).numpy()))
        if got != nbytes:
            return None
    return out


def plain_record(fh: BinaryIO, start: int, length: int) -> Optional[tuple[torch.Tensor, int]]:
    """(meta tensor, absolute file offset of its bytes) for a plain contiguous tensor blob, else None."""
    view = BlobView(fh, start, length)
    try:
        meta = torch.load(view, map_location="meta", weights_only=True)
        if not isinstance(meta, torch.Tensor) or not meta.is_contiguous() or meta.storage_offset() != 0:
            return None
        nbytes = meta.numel() * meta.element_size()
        if meta.untyped_storage().nbytes() != nbytes:
            return None
        order = _record(view, "/byteorder")
        if order is not None:
            offset, size = _record_bytes(view, order)
            view.seek(offset)
            if view.read(size) != b"little":
                return None
        data = _record(view, "/data/0")
        if data is None or data.compress_type != zipfile.ZIP_STORED:
            return None
        offset, size = _record_bytes(view, data)
    except Exception:
        return None
    if size != nbytes:
        return None
    return meta, start + offset
