"""Checkpoints with megatron-core dist_checkpointing (torch_dist), atomic and self-describing.

Design note. A run directory holds checkpoints/step_NNNNNNN/ directories and a `latest` file.
  save: every rank writes its shards into step_N.tmp/ (dist_checkpointing.save), then rank 0 adds
        config.yaml, tokenizer/ and train_state.json, renames step_N.tmp -> step_N, and replaces
        `latest` through a temp file + os.replace. A crash at any point leaves `latest` naming the
        previous complete checkpoint; stale *.tmp dirs are removed at the next save.
  load: the model's own sharded state dict is filled from the files, so any TP/PP/EP layout loads
        any other (torch_dist reshards). Optimizer state uses the `fully_reshardable` distributed-
        optimizer format and reshards too, except between EP=1 and EP>1, where megatron-core splits
        the optimizer into different sub-optimizers: that is refused with a clear error.
A checkpoint needs nothing but its path to be used later: the resolved config, tokenizer and the
layout it was written with travel inside it.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

from megatron_mtp.checkpoint.info import (
    check_optimizer_compatible,
    read_train_state,
    train_state_record,
    write_checkpoint_info,
)
from megatron_mtp.checkpoint.run_dir import CHECKPOINTS_DIR, LATEST, step_dir_name
from megatron_mtp.config import Config
from megatron_mtp.errors import UserError
from megatron_mtp.training.setup import Components, TrainState, unwrap

OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _sharded_state_dict(components: Components, state: TrainState, with_optimizer: bool, is_loading: bool) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    # explicit metadata: GPTModel's MTP-stage embedding tie reads metadata['dp_cp_group']
    model_sd = unwrap(components.model[0]).sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    sd = {
        "model": model_sd,
        "rng_state": ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0),
        "train_state": vars(state).copy(),
    }
    if with_optimizer:
        sd["optimizer"] = components.optimizer.sharded_state_dict(model_sd, is_loading=is_loading,
                                                                  metadata=OPTIMIZER_METADATA)
        sd["scheduler"] = components.scheduler.state_dict()
    return sd


def save_checkpoint(run_dir: Path, cfg: Config, components: Components, state: TrainState, ranks,
                    tokenizer, keep_last: int) -> Path:
    """`tokenizer` is a megatron_mtp.data.tokenizer.Tokenizer (saved HF-loadable), or None."""
    from megatron.core import dist_checkpointing

    ckpt_root = run_dir / CHECKPOINTS_DIR
    final = ckpt_root / step_dir_name(state.step)
    tmp = ckpt_root / (final.name + ".tmp")
    rank0 = torch.distributed.get_rank() == 0
    if rank0:
        ckpt_root.mkdir(parents=True, exist_ok=True)
        for stale in ckpt_root.glob("*.tmp"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():  # re-saving the same step (e.g. signal right after a periodic save)
            shutil.rmtree(final)
        tmp.mkdir()
    torch.distributed.barrier()
    dist_checkpointing.save(_sharded_state_dict(components, state, True, is_loading=False), str(tmp))
    torch.distributed.barrier()
    if rank0:
        info = train_state_record(**vars(state), has_optimizer=True, world_size=ranks.world_size,
                                  tensor=ranks.tp, pipeline=ranks.pp, expert=ranks.ep, data=ranks.dp)
        write_checkpoint_info(tmp, cfg, info, tokenizer)
        os.replace(tmp, final)
        latest_tmp = ckpt_root / (LATEST + ".tmp")
        latest_tmp.write_text(final.name + "\n")
        os.replace(latest_tmp, ckpt_root / LATEST)
        _prune(ckpt_root, keep_last, keep=final.name)
    torch.distributed.barrier()
    return final


def _prune(ckpt_root: Path, keep_last: int, keep: str) -> None:
    if keep_last <= 0:
        return
    steps = sorted(p for p in ckpt_root.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp"))
    for old in steps[:-keep_last]:
        if old.name != keep:
            shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(ckpt: Path, components: Components, ranks, load_optimizer: bool) -> TrainState:
    """Load weights (any layout) and, when asked, optimizer/scheduler/progress/RNG."""
    from megatron.core import dist_checkpointing

    saved = read_train_state(ckpt)
    _check_shard_files(ckpt)
    if load_optimizer:
        reason = check_optimizer_compatible(saved, ranks.ep)
        if reason is not None:
            raise UserError(f"cannot resume training from {ckpt}: {reason}; set checkpoint.load_optimizer=false "
                            "(with checkpoint.load) to start from its weights only")
        _prepare_optimizer_for_load(components.optimizer)
    sd = _sharded_state_dict(components, TrainState(), load_optimizer, is_loading=True)
    if not load_optimizer:
        sd.pop("rng_state")
        sd.pop("train_state")
    elif saved.get("world_size") != ranks.world_size:
        sd.pop("rng_state")  # per-rank RNG streams only make sense at the same world size
    loaded = dist_checkpointing.load(sd, str(ckpt))
    unwrap(components.model[0]).load_state_dict(loaded["model"], strict=True)
    if not load_optimizer:
        return TrainState()
    components.optimizer.load_state_dict(loaded["optimizer"])
    components.scheduler.load_state_dict(loaded["scheduler"])
    if "rng_state" in loaded:
        _set_rng_state(loaded["rng_state"])
    return TrainState(**{k: int(v) for k, v in loaded["train_state"].items()})


def _check_shard_files(ckpt: Path) -> None:
    """One clear error for a missing or truncated shard file (megatron-core would raise EOFError
    or FileNotFoundError from deep inside its reader). Reads only the .metadata index."""
    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader

    with TorchDistReader(ckpt) as reader:
        reader.validate(objects=tuple(reader.object_keys()))


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
