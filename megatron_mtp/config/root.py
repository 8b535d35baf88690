"""The whole run config and how it is loaded."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from typing import Any, Optional

import yaml

from megatron_mtp.config.base import apply_override, from_dict, load_yaml, to_dict
from megatron_mtp.config.data import DataConfig
from megatron_mtp.config.model import ModelConfig, MTPConfig, default_model_config
from megatron_mtp.config.parallel import ParallelConfig
from megatron_mtp.config.performance import KernelConfig, RecomputeConfig
from megatron_mtp.config.training import (
    CheckpointConfig,
    LoggingConfig,
    OptimizerConfig,
    ScheduleConfig,
    TrainingConfig,
)


@dataclass
class Config:
    name: str = "run"
    """A name for the run (used in logs and job names)."""
    model: ModelConfig = field(default_factory=default_model_config)
    """Model architecture."""
    mtp: MTPConfig = field(default_factory=MTPConfig)
    """Multi-Token Prediction depth and loss weight schedule."""
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    """Parallel layout and communication overlap."""
    recompute: RecomputeConfig = field(default_factory=RecomputeConfig)
    """Activation recomputation."""
    kernels: KernelConfig = field(default_factory=KernelConfig)
    """Fused kernels and router numerics."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training data."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """AdamW optimizer."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Learning-rate schedule."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Steps, batch sizes, precision."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Checkpointing."""
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    """Console and TensorBoard logging, periodic evaluation."""

    def to_dict(self) -> dict[str, Any]:
        return to_dict(self)

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.to_dict(), sort_keys=False)

    def replace(self, **sections) -> "Config":
        return dataclasses.replace(copy.deepcopy(self), **sections)


def load_config(path: Optional[str] = None, overrides: tuple[str, ...] | list[str] = ()) -> Config:
    """Defaults ← YAML file ← dotted overrides (left to right). Raises UserError on any bad key/value."""
    data = load_yaml(path) if path else {}
    # the model's family picks the class its other fields belong to: set it before the rest
    overrides = sorted(overrides, key=lambda o: not o.strip().startswith("model.family="))
    for override in overrides:
        apply_override(data, Config, override)
    return from_dict(Config, data)


def config_from_dict(data: dict[str, Any]) -> Config:
    return from_dict(Config, copy.deepcopy(data))
