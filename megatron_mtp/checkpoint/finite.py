"""Refusing non-finite weights while converting or loading: one sentence naming the tensor.

Decoded tensors are checked with torch.isfinite, in the read that decodes them. Bytes the converter
copies file to file without decoding need a read of their own, so they are scanned only when the
checkpoint does not say already: the trainer checks every weight with torch.isfinite before it saves
and records ``weights_finite: true`` in train_state.json (``recorded_finite``); an imported or older
checkpoint lacks the record and is scanned. The scan tests in place: a float is NaN or Inf exactly
when all its exponent bits are set, which one integer view of a memory map tests in bounded slices,
without a decode or a copy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import BinaryIO

import numpy as np
import torch

from megatron_mtp.errors import UserError

# dtype -> (integer view, exponent mask)
_EXPONENT = {
    torch.float32: (np.uint32, 0x7F800000),
    torch.bfloat16: (np.uint16, 0x7F80),
    torch.float16: (np.uint16, 0x7C00),
    torch.float64: (np.uint64, 0x7FF0000000000000),
}
_SLICE_BYTES = 64 << 20


def recorded_finite(step_dir: Path) -> bool:
    """Whether the checkpoint's train_state.json records that every weight was finite when it was saved."""
    try:
        return json.loads((Path(step_dir) / "train_state.json").read_text()).get("weights_finite") is True
    except (OSError, ValueError, AttributeError):
        return False


def tensor_is_finite(tensor: torch.Tensor) -> bool:
    if not tensor.is_floating_point():
        return True
    if tensor.element_size() == 1:  # FP8: torch.isfinite does not take it
        tensor = tensor.float()
    return bool(torch.isfinite(tensor).all())


def bytes_are_finite(fh: BinaryIO, offset: int, nbytes: int, dtype: torch.dtype) -> bool:
    """Whether the `dtype` values stored at file[offset:offset+nbytes] are all finite."""
    if dtype not in _EXPONENT:
        return True
    view, mask = _EXPONENT[dtype]
    item = np.dtype(view).itemsize
    count = nbytes // item
    values = np.memmap(fh, dtype=view, mode="r", offset=offset, shape=(count,))
    step = _SLICE_BYTES // item
    for start in range(0, count, step):
        if ((values[start:start + step] & view(mask)) == view(mask)).any():
            return False
    return True


def refuse_nonfinite(name: str, where: str) -> None:
    raise UserError(f"{where} holds non-finite values (NaN or Inf) in '{name}'; it cannot be used (take an "
                    "earlier checkpoint of the run)")
