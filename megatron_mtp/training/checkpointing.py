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

import json
import os
import random
import shutil
from pathlib import Path
from typing import Optional

import numpy as np
import torch

from megatron_mtp.config import Config, config_from_dict
from megatron_mtp.errors import UserError
from megatron_mtp.training.setup import Components, TrainState, unwrap

LATEST = "latest"
STATE_FILE = "train_state.json"
CONFIG_FILE = "config.yaml"
TOKENIZER_DIR = "tokenizer"
OPTIMIZER_METADATA = {"distrib_optim_sharding_type": "fully_reshardable", "chained_optim_avoid_prefix": True}


def step_dir_name(step: int) -> str:
    return f"step_{step:07d}"


def resolve_checkpoint(path: str | os.PathLike) -> Optional[Path]:
    """A step directory from a run dir, a checkpoints/ dir or a step dir; None if there is none."""
    path = Path(path)
    for base in (path / "checkpoints", path):
        latest = base / LATEST
        if latest.is_file():
            name = latest.read_text().strip()
            target = base / name
            if not (target / STATE_FILE).is_file():
                raise UserError(f"{latest} names '{name}', which is not a complete checkpoint; "
                                "delete the latest file to start over or restore the directory")
            return target
    if (path / STATE_FILE).is_file():
        return path
    return None


def read_checkpoint_info(ckpt: Path) -> tuple[dict, Config]:
    """train_state.json and the resolved config stored in a checkpoint."""
    import yaml

    try:
        state = json.loads((ckpt / STATE_FILE).read_text())
        cfg = config_from_dict(yaml.safe_load((ckpt / CONFIG_FILE).read_text()))
    except FileNotFoundError as exc:
        raise UserError(f"checkpoint {ckpt} is incomplete: {Path(exc.filename).name} is missing") from None
    return state, cfg


def _rng_state() -> dict:
    return {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state(),
            "cuda": torch.cuda.get_rng_state() if torch.cuda.is_available() else None}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if state.get("cuda") is not None and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _sharded_state_dict(comp: Components, state: TrainState, with_optimizer: bool, is_loading: bool) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    # explicit metadata: GPTModel's MTP-stage embedding tie reads metadata['dp_cp_group']
    model_sd = unwrap(comp.model[0]).sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    sd = {
        "model": model_sd,
        "rng_state": ShardedObject("rng_state", _rng_state(), (world,), (rank,), replica_id=0),
        "train_state": vars(state).copy(),
    }
    if with_optimizer:
        sd["optimizer"] = comp.optimizer.sharded_state_dict(model_sd, is_loading=is_loading, metadata=OPTIMIZER_METADATA)
        sd["scheduler"] = comp.scheduler.state_dict()
    return sd


def _use_fork_results_queue() -> None:
    """megatron-core's writer starts a 'spawn' Manager process per rank on its first save, which
    re-imports everything (tens of seconds for 8 ranks on 2 cores); a 'fork' Manager serves the
    same queue at once. Set before the first save; megatron-core reuses it for the process."""
    import multiprocessing

    from megatron.core.dist_checkpointing.strategies import filesystem_async

    if getattr(filesystem_async, "_results_queue", None) is None:
        filesystem_async._results_queue = multiprocessing.get_context("fork").Manager().Queue()


def save_checkpoint(run_dir: Path, cfg: Config, comp: Components, state: TrainState, layout,
                    tokenizer, keep_last: int) -> Path:
    """`tokenizer` is a megatron_mtp.data.tokenizer.Tokenizer (saved HF-loadable), or None."""
    from megatron.core import dist_checkpointing

    ckpt_root = run_dir / "checkpoints"
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
    _use_fork_results_queue()
    dist_checkpointing.save(_sharded_state_dict(comp, state, True, is_loading=False), str(tmp))
    torch.distributed.barrier()
    if rank0:
        (tmp / CONFIG_FILE).write_text(cfg.to_yaml())
        if tokenizer is not None:
            tokenizer.save(tmp / TOKENIZER_DIR)
        info = dict(vars(state), has_optimizer=True, world_size=layout.world_size,
                    parallel={"tensor": layout.tp, "pipeline": layout.pp, "expert": layout.ep, "data": layout.dp})
        (tmp / STATE_FILE).write_text(json.dumps(info, indent=2) + "\n")
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


def check_optimizer_compatible(saved: dict, layout) -> Optional[str]:
    """Why optimizer state cannot be loaded at this layout (None when it can)."""
    if not saved.get("has_optimizer", False):
        return "it holds no optimizer state"
    saved_ep = saved.get("parallel", {}).get("expert", 1)
    if (saved_ep == 1) != (layout.ep == 1):
        return (f"its optimizer state was written with expert parallel size {saved_ep} and cannot be "
                f"resharded to {layout.ep} (megatron-core splits it differently when EP=1 and EP>1)")
    return None


def load_checkpoint(ckpt: Path, comp: Components, layout, load_optimizer: bool) -> TrainState:
    """Load weights (any layout) and, when asked, optimizer/scheduler/progress/RNG."""
    from megatron.core import dist_checkpointing

    saved, _ = read_checkpoint_info(ckpt)
    _check_shard_files(ckpt)
    if load_optimizer:
        reason = check_optimizer_compatible(saved, layout)
        if reason is not None:
            raise UserError(f"cannot resume training from {ckpt}: {reason}; set checkpoint.load_optimizer=false "
                            "(with checkpoint.load) to start from its weights only")
        _prepare_optimizer_for_load(comp.optimizer)
    sd = _sharded_state_dict(comp, TrainState(), load_optimizer, is_loading=True)
    if not load_optimizer:
        sd.pop("rng_state")
        sd.pop("train_state")
    elif saved.get("world_size") != layout.world_size:
        sd.pop("rng_state")  # per-rank RNG streams only make sense at the same world size
    loaded = dist_checkpointing.load(sd, str(ckpt))
    unwrap(comp.model[0]).load_state_dict(loaded["model"], strict=True)
    if not load_optimizer:
        return TrainState()
    comp.optimizer.load_state_dict(loaded["optimizer"])
    comp.scheduler.load_state_dict(loaded["scheduler"])
    if "rng_state" in loaded:
        _set_rng_state(loaded["rng_state"])
    return TrainState(**{k: int(v) for k, v in loaded["train_state"].items()})


def _check_shard_files(ckpt: Path) -> None:
    """One clear error for a missing or truncated shard file (megatron-core would raise EOFError
    or FileNotFoundError from deep inside its reader). Reads only the .metadata index."""
    from megatron_mtp.convert.dist_reader import TorchDistReader

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
