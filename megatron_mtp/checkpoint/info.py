"""What a checkpoint records besides tensors, and the rules read from it.

``train_state.json`` holds the progress counters (step, consumed samples and tokens), whether
optimizer state is stored, and the layout the shards were written at; ``config.yaml`` the resolved
run config; ``tokenizer/`` the tokenizer the data was made with; ``manifest.json`` every file,
its size and digest (written last; ``run_dir.incomplete_reason`` checks it). The trainer, ``convert
from-hf`` and ``drop-mtp`` all write these through ``write_checkpoint_info``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Optional

from megatron_mtp.checkpoint.run_dir import CONFIG_FILE, STATE_FILE, TOKENIZER_DIR, write_manifest
from megatron_mtp.config import Config, config_from_dict
from megatron_mtp.errors import UserError


def read_train_state(step_dir: Path) -> dict[str, Any]:
    """train_state.json of a checkpoint; a missing or damaged file is one sentence."""
    file = step_dir / STATE_FILE
    try:
        state = json.loads(file.read_text())
    except FileNotFoundError:
        raise UserError(f"checkpoint {step_dir} is incomplete: {STATE_FILE} is missing") from None
    except (ValueError, UnicodeDecodeError):
        raise UserError(f"{file} is not valid JSON; the checkpoint is damaged (use another checkpoint)") from None
    if not isinstance(state, dict):
        raise UserError(f"{file} does not hold a JSON object; the checkpoint is damaged (use another checkpoint)")
    return state


def read_config(step_dir: Path) -> Config:
    """The resolved run config stored in a checkpoint."""
    import yaml

    file = step_dir / CONFIG_FILE
    try:
        data = yaml.safe_load(file.read_text())
    except FileNotFoundError:
        raise UserError(f"checkpoint {step_dir} has no {CONFIG_FILE}; it was not written by megatron-mtp") from None
    except yaml.YAMLError:
        raise UserError(f"{file} is not valid YAML; the checkpoint is damaged (use another checkpoint)") from None
    if not isinstance(data, dict):
        raise UserError(f"{file} does not hold a config mapping; the checkpoint is damaged (use another checkpoint)")
    return config_from_dict(data)


def read_checkpoint_info(step_dir: Path) -> tuple[dict[str, Any], Config]:
    """(train_state.json, config) of a checkpoint."""
    return read_train_state(step_dir), read_config(step_dir)


def train_state_record(step: int = 0, consumed_samples: int = 0, consumed_tokens: int = 0, *,
                       has_optimizer: bool, world_size: int = 1, tensor: int = 1, pipeline: int = 1,
                       expert: int = 1, data: int = 1, **extra: Any) -> dict[str, Any]:
    """The train_state.json record: progress, whether optimizer state is stored, and the layout."""
    return {"step": step, "consumed_samples": consumed_samples, "consumed_tokens": consumed_tokens,
            "has_optimizer": has_optimizer, "world_size": world_size,
            "parallel": {"tensor": tensor, "pipeline": pipeline, "expert": expert, "data": data}, **extra}


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def write_checkpoint_info(step_dir: Path, cfg: Config, state: dict[str, Any], tokenizer=None,
                          digests: Optional[dict[str, str]] = None) -> None:
    """Write config.yaml, tokenizer/ (a data.tokenizer.Tokenizer, or None), train_state.json and, last,
    manifest.json (every file, its size and digest: what makes the checkpoint complete, run_dir's design
    note; `digests`: those the writing ranks computed, checkpoint/digests.py). Call it when every other
    file of the checkpoint is written, before the directory gets its name."""
    _write_atomic(step_dir / CONFIG_FILE, cfg.to_yaml())
    if tokenizer is not None:
        tokenizer.save(step_dir / TOKENIZER_DIR)
    _write_atomic(step_dir / STATE_FILE, json.dumps(state, indent=2) + "\n")
    write_manifest(step_dir, digests)


OPTIMIZER_FORMATS = {"parallel": "dp_reshardable", "reshardable": "fully_reshardable"}
"""checkpoint.optimizer_format -> megatron-core's distributed-optimizer sharding type."""


def saved_optimizer_format(saved: dict[str, Any]) -> str:
    """The optimizer format a checkpoint was written in (checkpoints from before the choice: reshardable)."""
    return saved.get("optimizer_format", "reshardable")


def optimizer_layout(cfg: Config) -> dict[str, Any]:
    """What the parallel-format optimizer state depends on besides data parallelism: the model-parallel
    sizes, which layers each pipeline chunk holds, and the DDP buckets the state is laid out in."""
    from megatron_mtp.config import pipeline_layout

    p, m = cfg.parallel, cfg.model
    text, vpp = pipeline_layout.resolve(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                        p.pipeline_layout)
    return {"tensor": p.tensor, "pipeline": p.pipeline, "virtual_pipeline": vpp, "pipeline_layout": text,
            "expert": p.expert, "expert_tensor": p.expert_tensor or p.tensor, "bucket_size": p.bucket_size,
            "distributed_optimizer": p.distributed_optimizer,
            **({"context": p.context} if p.context > 1 else {})}  # absent at CP 1, as in older checkpoints


def _layout_words(layout: dict[str, Any]) -> str:
    return (f"TP{layout.get('tensor')} × PP{layout.get('pipeline')} (VPP{layout.get('virtual_pipeline')}) × "
            + (f"CP{layout['context']} × " if layout.get("context", 1) > 1 else "") +
            f"EP{layout.get('expert')} × ETP{layout.get('expert_tensor')}, parallel.bucket_size="
            f"{layout.get('bucket_size')}")


def check_optimizer_compatible(saved: dict[str, Any], expert_parallel: int,
                               layout: Optional[dict[str, Any]] = None) -> Optional[str]:
    """Why a checkpoint's optimizer state cannot be loaded at this expert-parallel size, or (with
    `layout`, this run's ``optimizer_layout``) at this layout (None if it can)."""
    if not saved.get("has_optimizer", False):
        return "it holds no optimizer state"
    saved_ep = saved.get("parallel", {}).get("expert", 1)
    if (saved_ep == 1) != (expert_parallel == 1):
        return (f"its optimizer state was written with expert parallel size {saved_ep} and cannot be "
                f"resharded to {expert_parallel} (megatron-core splits it differently when EP=1 and EP>1)")
    before = saved.get("optimizer_layout")
    if (layout is not None and before is not None and saved_optimizer_format(saved) == "parallel"
            and before.get("distributed_optimizer") and before != layout):
        return (f"its optimizer state is in the parallel format (checkpoint.optimizer_format=parallel), which "
                f"reshards only across data-parallel ranks, and was written at {_layout_words(before)}, not "
                f"{_layout_words(layout)}; resume once at the layout it was written with and "
                "checkpoint.optimizer_format=reshardable until its next save, then at the new layout")
    return None
