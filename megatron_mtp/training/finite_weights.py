"""Whether the model a rank holds is all finite, agreed by every rank, with the name of a bad tensor.

(megatron_mtp/checkpoint/finite.py checks tensors in checkpoint files, without building a model.)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from megatron_mtp.errors import RunError


def first_nonfinite_parameter(model_chunks: list) -> Optional[str]:
    """The name of a parameter holding NaN or Inf on any rank (the same answer on every rank), or None."""
    from megatron_mtp.training.components import unwrap

    named = [(name, p) for chunk in model_chunks for name, p in unwrap(chunk).named_parameters()]
    bad = None
    if named:
        finite = torch.stack([torch.isfinite(p).all() for _, p in named])  # one device sync
        if not bool(finite.all()):
            bad = named[int((~finite).nonzero()[0])][0]
    if not torch.distributed.is_initialized() or torch.distributed.get_world_size() == 1:
        return bad
    names: list = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(names, bad)
    return next((n for n in names if n), None)


def refuse_nonfinite_loaded_weights(components, ckpt: Path) -> None:
    """Weights loaded from `ckpt` that hold NaN or Inf are one sentence, on every rank."""
    bad = first_nonfinite_parameter(components.model)
    if bad is not None:
        raise RunError(f"checkpoint {ckpt} holds non-finite values (NaN or Inf) in '{bad}'; use an earlier "
                       "checkpoint of the run")
