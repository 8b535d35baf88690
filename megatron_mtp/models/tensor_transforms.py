"""How one megatron-core tensor becomes its Hugging Face tensor(s) and back: the transform a tensor rule holds
(models/tensor_table.py), one named class per kind, as Megatron-Bridge names its mappings (its QKV mapping,
its gated-MLP mapping, ...). The converters (convert/to_hf.py, convert/from_hf.py) call a row's transform to cut,
join and type its tensors; they ask its kind only to pass over a ``Copy`` on import.

A transform works on one megatron-core tensor, or on one expert's slice of a tensor with a leading expert axis
whose Hugging Face names hold ``{e}``: its Hugging Face tensors are the parts of its dim 0, in the rule's ``hf``
order. Imports only what a config needs (torch where a tensor is cut or joined).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional, Sequence


@dataclass(frozen=True)
class Transform:
    """The interface, and dim 0 cut into ``parts`` equal runs of rows."""

    parts: ClassVar[int] = 1
    """How many Hugging Face tensors (names) the megatron-core tensor is."""
    interleaved: ClassVar[bool] = False
    """The parts' rows interleave in the megatron-core tensor (not one run of rows each, whose stored bytes an
    export may copy as they are)."""
    per_expert: ClassVar[bool] = True
    """A tensor with an expert axis is one Hugging Face tensor per expert (``{e}`` in the names)."""

    def for_model(self, model: Any) -> Transform:
        """This transform with the numbers of ``model`` (a rule's -> the rows made of it)."""
        return self

    def dtype(self, export: Any) -> Any:
        """The dtype the tensor is written and read in, for an export or import in ``export``."""
        return export

    def part_rows(self, rows: int) -> list[int]:
        """Rows (dim 0) of each Hugging Face tensor, for a megatron-core tensor of ``rows`` rows."""
        return [rows // self.parts] * self.parts

    def to_hf(self, tensor: Any) -> list:
        """The Hugging Face tensors of one megatron-core tensor, in ``hf`` order."""
        return [tensor] if self.parts == 1 else list(tensor.chunk(self.parts, dim=0))

    def from_hf(self, parts: Sequence) -> Any:
        """The inverse of ``to_hf``: one megatron-core tensor from its Hugging Face tensors."""
        import torch

        return parts[0] if len(parts) == 1 else torch.cat(list(parts), dim=0)


@dataclass(frozen=True)
class Direct(Transform):
    """One Hugging Face tensor, the megatron-core tensor as it is."""


@dataclass(frozen=True)
class Copy(Direct):
    """A copy of another row's tensor that the release format writes again (an MTP module's copy of the embedding
    and of the output head): written on export, not read back on import, no state of its own."""


@dataclass(frozen=True)
class Fp32(Direct):
    """A tensor kept in fp32 in every export and import (the router's ``e_score_correction_bias``)."""

    def dtype(self, export: Any) -> Any:
        import torch

        return torch.float32


@dataclass(frozen=True)
class Int64(Direct):
    """An integer buffer, written and read as int64, never cast (an assistant's ``token_ordering``)."""

    def dtype(self, export: Any) -> Any:
        import torch

        return torch.int64


@dataclass(frozen=True)
class StackedExperts(Direct):
    """Routed experts in one Hugging Face tensor with a leading expert axis, as the megatron-core tensor has
    (Gemma 4's ``experts.gate_up_proj``), not one Hugging Face tensor per expert."""

    per_expert: ClassVar[bool] = False


@dataclass(frozen=True)
class GatedFusion(Transform):
    """A SwiGLU fc1, [gate; up] on dim 0 in two equal halves (``gate_proj``, ``up_proj``)."""

    parts: ClassVar[int] = 2


@dataclass(frozen=True)
class QKVFusion(Transform):
    """megatron-core's ``linear_qkv``, q, k and v interleaved per key/value group on dim 0: [group 0: its query
    heads, its key head, its value head; group 1: ...] (so a tensor-parallel rank holds whole groups); the bias
    alike. A rule's holds ``layout``; the rows made of it hold its numbers (``for_model``)."""

    parts: ClassVar[int] = 3
    interleaved: ClassVar[bool] = True
    groups: int = 0
    """Key/value groups."""
    per_group: int = 0
    """Query heads per group."""
    head: int = 0
    """Head dim."""
    layout: Optional[Callable[[Any], tuple[int, int, int]]] = field(default=None, compare=False, repr=False)
    """model -> (groups, per_group, head)."""

    def for_model(self, model: Any) -> QKVFusion:
        return self if self.layout is None else QKVFusion(*self.layout(model))

    def part_rows(self, rows: int) -> list[int]:
        return [self.groups * self.per_group * self.head, self.groups * self.head, self.groups * self.head]

    def to_hf(self, tensor: Any) -> list:
        rest = tuple(tensor.shape[1:])
        grouped = tensor.reshape(self.groups, self.per_group + 2, self.head, *rest)
        q, k, v = grouped.split([self.per_group, 1, 1], dim=1)
        return [q.reshape(-1, *rest), k.reshape(-1, *rest), v.reshape(-1, *rest)]

    def from_hf(self, parts: Sequence) -> Any:
        import torch

        q, k, v = parts
        rest = tuple(q.shape[1:])
        grouped = torch.cat([q.reshape(self.groups, self.per_group, self.head, *rest),
                             k.reshape(self.groups, 1, self.head, *rest),
                             v.reshape(self.groups, 1, self.head, *rest)], dim=1)
        return grouped.reshape(-1, *rest)


DIRECT, GATED = Direct(), GatedFusion()
