"""Named float64 sums packed into one vector, so that one all-reduce carries all of them.

    sums = NamedSums(lm_loss=1, mtp_loss=depth)
    sums["mtp_loss"] += per_depth          # a view into the vector
    total = sums.all_reduced()             # one collective for every field
"""

from __future__ import annotations

import torch


class NamedSums:
    def __init__(self, **lengths: int):
        self._slices: dict[str, slice] = {}
        offset = 0
        for name, length in lengths.items():
            self._slices[name] = slice(offset, offset + length)
            offset += length
        self.vector = torch.zeros(offset, dtype=torch.float64)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.vector[self._slices[name]]

    def __setitem__(self, name: str, value) -> None:
        self.vector[self._slices[name]] = value

    def value(self, name: str) -> float:
        """A one-element field as a float."""
        return float(self[name][0])

    def zero_(self) -> None:
        self.vector.zero_()

    def copy(self) -> "NamedSums":
        other = NamedSums.__new__(NamedSums)
        other._slices = self._slices
        other.vector = self.vector.clone()
        return other

    def all_reduced(self) -> "NamedSums":
        """A copy summed over every rank of the job."""
        from megatron_mtp.platform import all_reduce_sum

        other = self.copy()
        other.vector = all_reduce_sum(other.vector)
        return other
