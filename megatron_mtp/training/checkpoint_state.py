"""What a checkpoint holds of a run, and loading it (saving: checkpoint_saver.py).

Design note. The state is megatron-core sharded state dicts: the model chunks' (keys are global:
`decoder.layers.<global index>`, routed experts on a global expert axis), the optimizer's, the LR
scheduler, the progress counters and a per-rank RNG object. The distributed optimizer's state is
written in checkpoint.optimizer_format:
  - parallel (megatron-core's `dp_reshardable`, the default): each rank writes its own shard as it
    lies in the DDP buckets, with no exchange and no extra memory; it reshards across data-parallel
    ranks only, so a resume at another model-parallel layout or bucket size is refused in one
    sentence naming the way out (info.check_optimizer_compatible);
  - reshardable (`fully_reshardable`): the state is gathered over the data-parallel ranks into one
    tensor per parameter (every rank holds its model-parallel shard's whole optimizer state on the
    host during the save) and any TP/PP/VPP/EP layout loads it (torch_dist reshards).
The format a checkpoint was written in is in its train_state.json, and the load follows it. Any
layout loads the weights. Between EP=1 and EP>1 megatron-core splits the optimizer into different
sub-optimizers: that optimizer state is refused with a clear error in either format. With the interleaved schedule the
chunks are "model0".."modelN" instead of "model"; the names do not reach the files.
A checkpoint needs nothing but its path to be used later: the resolved config, tokenizer and the
layout it was written with travel inside it (checkpoint/info.py).
"""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import torch

from megatron_mtp.checkpoint.info import (
    OPTIMIZER_FORMATS,
    check_optimizer_compatible,
    read_train_state,
    saved_optimizer_format,
)
from megatron_mtp.errors import UserError
from megatron_mtp.training.components import Components, TrainState, unwrap
from megatron_mtp.training.schedules import config_hyperparameters_kept


def optimizer_metadata(optimizer_format: str) -> dict:
    """megatron-core's metadata for the distributed optimizer's state dict in checkpoint.optimizer_format."""
    return {"distrib_optim_sharding_type": OPTIMIZER_FORMATS[optimizer_format], "chained_optim_avoid_prefix": True}


class DamagedCheckpoint(UserError):
    """A checkpoint whose files are all there, at their sizes, but whose bytes cannot be read back (a
    shard overwritten in place, a bad disk block) or do not match their digests (checkpoint/digests.py).
    torch.distributed.checkpoint gathers a read failure of any rank onto every rank, and the digest
    check gathers its findings, so every rank raises this together. `what`: the damage in a few words."""

    def __init__(self, ckpt: Path, cause: str, reading: bool = True):
        self.ckpt, self.cause = ckpt, cause
        self.every_rank = not reading  # the digest check's findings are gathered: printed once
        self.what = f"reading it failed: {cause}" if reading else cause
        super().__init__(f"checkpoint {ckpt} is damaged: {f'reading it failed ({cause})' if reading else cause}; "
                         "use another checkpoint (a run directory resumes from its newest readable one)")


def _read_failure_types() -> tuple:
    import pickle

    from torch.distributed.checkpoint.api import CheckpointException

    return (CheckpointException, pickle.UnpicklingError, EOFError, RuntimeError, OSError)


_READ_FAILURES = _read_failure_types()
_READ_FAILURE_WORDS = ("PytorchStreamReader", "UnpicklingError", "invalid load key", "EOFError", "Ran out of input",
                       "unpickling", "zip archive", "CRC", "OSError", "Input/output error")


def read_failure(exc: BaseException) -> str | None:
    """The cause of a failed checkpoint read in a few words (its innermost error's last line), or None
    when `exc` is not a read failure (a bug: re-raised as it is)."""
    text = str(exc)
    if type(exc).__name__ == "CheckpointException":
        lines = [line.strip() for line in text.splitlines() if line.strip() and not line.startswith(" ")]
        last = lines[-1] if lines else text
    else:
        last = f"{type(exc).__name__}: {text.strip().splitlines()[-1] if text.strip() else ''}"
    if not any(word in text or word in last or word in type(exc).__name__ for word in _READ_FAILURE_WORDS):
        return None
    return last[:200]


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _model_keys(components: Components) -> list[str]:
    n = len(components.model)
    return ["model"] if n == 1 else [f"model{i}" for i in range(n)]


def sharded_state_dict(components: Components, state: TrainState, with_optimizer: bool, is_loading: bool,
                       optimizer_format: str = "parallel") -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    # explicit metadata: GPTModel's MTP-stage embedding tie reads metadata['dp_cp_group']
    chunks = {key: unwrap(chunk).sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
              for key, chunk in zip(_model_keys(components), components.model)}
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    sd = {**chunks,
          "rng_state": ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0),
          "train_state": vars(state).copy()}
    if with_optimizer:
        model_sd = chunks["model"] if len(chunks) == 1 else chunks
        sd["optimizer"] = components.optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                                  metadata=optimizer_metadata(optimizer_format))
        sd["scheduler"] = components.scheduler.state_dict()
    return sd


def _load_strategy(ckpt: Path, fully_parallel: bool):
    """megatron-core's default reader, wrapped so the data-parallel ranks share the reading."""
    if not fully_parallel:
        return None
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    return FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(ckpt)),
                                            parallel_state.get_data_parallel_group(with_context_parallel=True))


def load_checkpoint(ckpt: Path, components: Components, ranks, load_optimizer: bool,
                    fully_parallel: bool = True, cfg=None, layout: dict | None = None) -> TrainState:
    """Load weights (any layout) and, when asked, optimizer/scheduler/progress/RNG (`layout`: this run's
    info.optimizer_layout, which a parallel-format optimizer state must have been written at)."""
    from megatron.core import dist_checkpointing

    saved = read_train_state(ckpt)
    _check_shard_files(ckpt)
    _check_digests(ckpt)
    if load_optimizer:
        reason = check_optimizer_compatible(saved, ranks.ep, layout)
        if reason is not None:
            raise UserError(f"cannot resume training from {ckpt}: {reason}; or set checkpoint.load_optimizer=false "
                            "(with checkpoint.load) to start from its weights only")
        _prepare_optimizer_for_load(components.optimizer)
    sd = sharded_state_dict(components, TrainState(), load_optimizer, is_loading=True,
                            optimizer_format=saved_optimizer_format(saved))
    if not load_optimizer:
        sd.pop("rng_state")
        sd.pop("train_state")
    elif saved.get("world_size") != ranks.world_size:
        sd.pop("rng_state")  # per-rank RNG streams only make sense at the same world size
    # a grown family's checkpoint keys first, so that a new MTP module copies the last layer under them
    growth = _grown_family(ckpt, cfg, components, sd) if cfg is not None and not load_optimizer else None
    new_mtp, copies = (_new_mtp_modules(ckpt, cfg, components, sd) if cfg is not None and not load_optimizer
                       else (set(), []))
    try:
        loaded = dist_checkpointing.load(sd, str(ckpt), sharded_strategy=_load_strategy(ckpt, fully_parallel))
    except _READ_FAILURES as exc:
        cause = read_failure(exc)
        if cause is None:
            raise
        raise DamagedCheckpoint(ckpt, cause) from exc
    # one load per new module: each reads the same last-layer tensors, which one load can't read twice
    copied: dict = {}
    for module_copies in copies:  # every rank: the config decides
        for key, chunk_sd in dist_checkpointing.load(module_copies, str(ckpt)).items():
            copied.setdefault(key, {}).update(chunk_sd)
    for key, chunk in zip(_model_keys(components), components.model):
        lenient = bool(new_mtp) or growth is not None
        result = unwrap(chunk).load_state_dict({**loaded[key], **copied.get(key, {})}, strict=not lenient)
        if lenient:  # only the new MTP parts and the tensors a grown family adds keep their initial weights
            unexpected = list(result.unexpected_keys)
            missing = [k for k in result.missing_keys if not k.startswith(tuple(new_mtp))
                       and not (growth is not None and growth.fresh(k))]
            if unexpected or missing:
                raise RuntimeError(f"loading {ckpt}: unexpected {unexpected[:3]}, missing {missing[:3]}")
    if not load_optimizer:
        return TrainState()
    from megatron_mtp.platform.megatron_core import align_saved_param_groups

    align_saved_param_groups(loaded["optimizer"], components.optimizer.param_groups)
    with config_hyperparameters_kept(components.optimizer):  # the config's schedule wins (schedules.py)
        components.optimizer.load_state_dict(loaded["optimizer"])
    components.scheduler.load_state_dict(loaded["scheduler"])
    if "rng_state" in loaded:
        _set_rng_state(loaded["rng_state"])
    return TrainState(**{k: int(v) for k, v in loaded["train_state"].items()})


def _grown_family(ckpt: Path, cfg, components: Components, sd: dict):
    """checkpoint.load of another family's checkpoint into a model that grows from it (ModelConfig.grows_from):
    the tensors the model's family adds leave the state dict to load (they keep their initial weights), the
    others are read under the checkpoint's keys. Returns the Growth, or None for a checkpoint of the run's family."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from megatron_mtp.checkpoint.info import read_config

    family = read_config(ckpt).model.family
    growth = cfg.model.grows_from(family) if family != cfg.model.family else None
    if growth is None:
        return None
    for key in _model_keys(components):
        chunk = sd[key]
        for name in [n for n in chunk if growth.fresh(n)]:
            chunk.pop(name)
        for entry in chunk.values():
            if isinstance(entry, (ShardedTensor, ShardedTensorFactory)):
                entry.key = growth.checkpoint_key(entry.key)
    return growth


def _new_mtp_modules(ckpt: Path, cfg, components: Components, sd: dict) -> tuple[set[str], list[dict]]:
    """MTP modules or parallel heads this run has and the checkpoint lacks (a weights-only load of a model
    trained or imported with fewer, or with another MTP style), or the whole assistant (mtp.style assistant)
    beside a target saved without one (checkpoint/resume_rules.mtp_parts). Their entries leave the state
    dict to load, so they keep their initial weights; with mtp.init=copy_last_layer each module's or head's
    transformer-layer entries come back as a state dict of its own whose keys name the checkpoint's last
    decoder layer (same keys below the layer prefix; each read in a load of its own, since one load can't
    read a tensor twice on a rank). Returns (their prefixes, those state dicts)."""
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory

    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.checkpoint.resume_rules import mtp_parts

    saved = mtp_parts(read_config(ckpt).mtp)
    order = [p for p in mtp_parts(cfg.mtp) if p not in saved]
    if not order:
        return set(), []
    last = f"decoder.layers.{cfg.model.num_layers - 1}."
    copies: list[dict] = [{} for _ in order]
    for key in _model_keys(components):
        chunk = sd[key]
        for name in [n for n in chunk if n.startswith(tuple(order))]:
            entry = chunk.pop(name)
            index = next(i for i, p in enumerate(order) if name.startswith(p))
            layer = order[index] + "transformer_layer."
            if (cfg.mtp.init == "copy_last_layer" and isinstance(entry, (ShardedTensor, ShardedTensorFactory))
                    and entry.key.startswith(layer)):
                entry.key = last + entry.key[len(layer):]
                copies[index].setdefault(key, {})[name] = entry
    return set(order), ([c for c in copies if c] if cfg.mtp.init == "copy_last_layer" else [])


def _check_shard_files(ckpt: Path) -> None:
    """One clear error for a missing or truncated shard file (megatron-core would raise EOFError
    or FileNotFoundError from deep inside its reader). Reads only the .metadata index."""
    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

    with TorchDistReader(ckpt) as reader:
        reader.validate(objects=tuple(reader.object_keys()), digests=False)  # every rank: see _check_digests


def _check_digests(ckpt: Path) -> None:
    """Every file the manifest pins has its digest (checkpoint/digests.py), checked by all ranks together,
    each over its share of the bytes; a mismatch anywhere is DamagedCheckpoint on every rank. A
    checkpoint without digests is not checked."""
    from megatron_mtp.checkpoint.digests import mismatch, share
    from megatron_mtp.checkpoint.run_dir import read_digests

    pinned = read_digests(ckpt)
    if pinned is None:
        return
    sizes, expected = pinned
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    found = [None] * world
    torch.distributed.all_gather_object(found, mismatch(ckpt, share(sizes, rank, world), expected))
    problems = sorted(p for p in found if p)
    if problems:
        raise DamagedCheckpoint(ckpt, problems[0] + (f", and {len(problems) - 1} more file" if len(problems) > 1
                                                      else ""), reading=False)


def _prepare_optimizer_for_load(optimizer) -> None:
    """Give a fresh torch Adam the per-parameter state (incl. 'step') a checkpoint load expects.

    megatron-core builds the optimizer's load-time state dict from the live optimizer state; a
    torch Adam that has never stepped has none. A zero-lr, zero-grad step creates it; every value
    is overwritten by the load that follows.
    """
    for opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(opt, "optimizer", None)
        if inner is None or all(len(inner.state.get(p, {})) for g in inner.param_groups for p in g["params"]):
            continue
        saved_lrs = [g["lr"] for g in inner.param_groups]
        for g in inner.param_groups:
            g["lr"] = 0.0
            for p in g["params"]:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
        inner.step()
        for g, lr in zip(inner.param_groups, saved_lrs):
            g["lr"] = lr
        inner.zero_grad(set_to_none=True)
