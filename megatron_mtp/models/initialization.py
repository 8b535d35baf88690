"""Initial weights that do not depend on the parallel layout.

Design note. megatron-core draws each rank's initial weights from that rank's position in one random
stream, so the same seed gives a different model at TP2, PP2 or EP8 than in one process, and a run
can't be reproduced or debugged at a smaller layout. Here every parameter is drawn again from a
generator of its own, seeded by the run's seed and the parameter's *global* identity: its checkpoint
key (global layer number, name) plus the index it has along the axes megatron-core prepends (the
expert index for routed experts). The full tensor is drawn on the CPU and the rank keeps its slice,
found from the same sharded state dict the checkpoints use (global shape, offset and fragmentation,
SwiGLU halves included), so the weights are bitwise the same at every TP/PP/VPP/EP/ETP layout and
on CPU and GPU. What is drawn keeps megatron-core's distributions: N(0, σ) with σ =
``init_method_std``, and σ/√(2·num_layers) for the projections back into the residual stream
(``linear_proj``, ``linear_fc2``), as megatron-core's ``output_layer_init_method``. Parameters
megatron-core sets to a constant (norm weights 1, biases 0) are the same everywhere already and kept.

Cost: each rank draws the full tensor of every parameter it holds a slice of (the TP-split ones
TP times over) and one full tensor per local expert; see `tools/bench/bench_init.py`.
"""

from __future__ import annotations

import hashlib
import math

import torch

OUTPUT_PROJECTIONS = ("linear_proj.weight", "linear_fc2.weight")
"""Checkpoint-key endings of the layers that write back into the residual stream (scaled σ)."""


def parameter_seed(seed: int, key: str, index: tuple) -> int:
    """The generator seed of one tensor: the run's seed, its checkpoint key, its prepended index."""
    text = f"{seed}|{key}|{','.join(map(str, index))}"
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") >> 1


def parameter_std(key: str, init_method_std: float, num_layers: int) -> float:
    if key.endswith(OUTPUT_PROJECTIONS):
        return init_method_std / math.sqrt(2.0 * num_layers)
    return init_method_std


def draw_full(seed: int, key: str, index: tuple, shape: tuple, std: float) -> torch.Tensor:
    """The whole tensor `key` (at `index` along the prepended axes), fp32 on the CPU."""
    gen = torch.Generator().manual_seed(parameter_seed(seed, key, index))
    return torch.empty(shape, dtype=torch.float32).normal_(0.0, std, generator=gen)


def _is_constant(t: torch.Tensor) -> bool:
    flat = t.detach().reshape(-1)
    return bool(flat.numel() and (flat == flat[0]).all())


def initialize_layout_invariant(model, seed: int, init_method_std: float, num_layers: int) -> int:
    """Draw every random parameter of `model` (one GPTModel chunk, before any wrapper) again from
    its own generator; returns how many tensors were drawn. Call before DDP and the optimizer."""
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    params = {p.untyped_storage().data_ptr(): (name, p) for name, p in model.named_parameters()}
    random = {name for name, p in model.named_parameters() if not _is_constant(p)}
    sd = model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
    apply_factories(sd)
    drawn, done, cache = 0, set(), {}
    with torch.no_grad():
        for sh in nested_values(sd):
            if not isinstance(sh, ShardedTensor) or sh.data is None:
                continue
            owner = params.get(sh.data.untyped_storage().data_ptr())
            if owner is None or owner[0] not in random:
                continue  # a buffer (expert bias, token counts) or a constant parameter
            if sh.flattened_range is not None:
                raise RuntimeError(f"{sh.key}: a flattened shard can't be initialised by global identity")
            n = sh.prepend_axis_num
            index, shape = tuple(sh.global_offset[:n]), tuple(sh.global_shape[n:])
            ident = (sh.key, index)
            if ident not in cache:  # SwiGLU's two halves are two shards of one drawn tensor
                cache = {ident: draw_full(seed, sh.key, index, shape,
                                          parameter_std(sh.key, init_method_std, num_layers))}
                drawn += 1
            full = cache[ident]
            part = full[tuple(slice(o, o + s) for o, s in zip(sh.global_offset[n:], sh.data.shape))]
            if tuple(part.shape) != tuple(sh.data.shape):
                raise RuntimeError(f"{sh.key}: slice {tuple(part.shape)} of {shape} does not fit the local "
                                   f"shard {tuple(sh.data.shape)}")
            sh.data.copy_(part)
            done.add(owner[0])
    missed = sorted(random - done)
    if missed:
        raise RuntimeError(f"no checkpoint key covers these parameters, so they can't be initialised by "
                           f"global identity: {', '.join(missed)}")
    return drawn
