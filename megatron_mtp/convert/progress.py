"""A tqdm progress bar counting bytes (with rate) and tensors, shared by every conversion."""

from __future__ import annotations

import os
import sys
import time

from tqdm import tqdm


class Progress:
    """Bytes-scaled bar with a tensors/s postfix; silent when MEGATRON_MTP_NO_PROGRESS is set."""

    def __init__(self, total_bytes: int, desc: str) -> None:
        disable = bool(os.environ.get("MEGATRON_MTP_NO_PROGRESS")) or not sys.stderr
        self._bar = tqdm(total=total_bytes, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=disable)
        self._tensors = 0
        self._start = time.monotonic()

    def advance(self, nbytes: int, tensors: int = 1) -> None:
        self._tensors += tensors
        rate = self._tensors / max(time.monotonic() - self._start, 1e-9)
        self._bar.set_postfix_str(f"{self._tensors} tensors, {rate:.1f} tensors/s", refresh=False)
        self._bar.update(nbytes)

    def close(self) -> None:
        self._bar.close()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
