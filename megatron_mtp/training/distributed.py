"""Process-group setup: torch.distributed from torchrun-style env vars, then megatron parallel state."""

from __future__ import annotations

import datetime
import os
import random
from dataclasses import dataclass

import numpy as np
import torch

from megatron_mtp.config import Config
from megatron_mtp.errors import UserError
from megatron_mtp.platform import Platform

_OWNS_PROCESS_GROUP = False
"""init_distributed created the world process group (and destroy() ends it); one that a host process
set up before (a harness running several jobs in one set of processes) is left to it."""


@dataclass(frozen=True)
class Ranks:
    """This process's place in the parallel grid (sizes and this process's rank along each)."""

    rank: int
    world_size: int
    tp: int
    pp: int
    ep: int
    dp: int
    tp_rank: int
    pp_rank: int
    ep_rank: int
    dp_rank: int
    vpp: int = 1
    """Model chunks on this pipeline rank (interleaved schedule when > 1)."""
    etp: int = 1
    """Tensor-parallel size inside the routed experts."""
    cp: int = 1
    """Context-parallel ranks that share each sequence (parallel.context)."""
    cp_rank: int = 0

    @property
    def is_last_stage(self) -> bool:
        return self.pp_rank == self.pp - 1


def env_world() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(cfg: Config, platform: Platform) -> Ranks:
    """Join the job described by RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT (single process if unset)."""
    from megatron.core import parallel_state

    global _OWNS_PROCESS_GROUP
    rank, world = env_world()
    if not torch.distributed.is_initialized():
        _OWNS_PROCESS_GROUP = True
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" not in os.environ:
            if world > 1:
                raise UserError("WORLD_SIZE > 1 but MASTER_PORT is not set; launch through torchrun, "
                                "`megatron-mtp train --nproc-per-node N` or `megatron-mtp submit`")
            os.environ["MASTER_PORT"] = "0"  # the one rank's store binds a free port itself
            os.environ.pop("TORCHELASTIC_USE_AGENT_STORE", None)  # and hosts it (no launcher's store)
        torch.distributed.init_process_group(
            backend=platform.backend, rank=rank, world_size=world,
            timeout=datetime.timedelta(seconds=cfg.training.collective_timeout),
        )
    from megatron_mtp.models.megatron_config import megatron_layout

    p = cfg.parallel
    _, vpp = megatron_layout(cfg)
    etp = p.expert_tensor or p.tensor
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=p.tensor,
        pipeline_model_parallel_size=p.pipeline,
        virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
        expert_model_parallel_size=p.expert,
        expert_tensor_parallel_size=etp,
        context_parallel_size=p.context,
        # megatron-core builds every group with this timeout (30 minutes unless told), not the world's
        distributed_timeout_minutes=cfg.training.collective_timeout / 60,
    )
    seed_everything(cfg.training.seed, platform)
    return Ranks(
        vpp=vpp,
        etp=etp,
        rank=rank,
        world_size=world,
        tp=p.tensor,
        pp=p.pipeline,
        ep=p.expert,
        dp=parallel_state.get_data_parallel_world_size(),
        tp_rank=parallel_state.get_tensor_model_parallel_rank(),
        pp_rank=parallel_state.get_pipeline_model_parallel_rank(),
        ep_rank=parallel_state.get_expert_model_parallel_rank(),
        dp_rank=parallel_state.get_data_parallel_rank(),
        cp=parallel_state.get_context_parallel_world_size(),
        cp_rank=parallel_state.get_context_parallel_rank(),
    )


def seed_everything(seed: int, platform: Platform) -> None:
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    # On CPU the CUDA RNG tracker cannot fork CUDA states; the inference tracker is a no-op
    # (our models have no dropout, so no per-TP-rank RNG streams are needed).
    model_parallel_cuda_manual_seed(seed, inference_rng_tracker=platform.is_cpu)


def destroy() -> None:
    """Tear down megatron-core's parallel state, and the world process group if init_distributed made it."""
    global _OWNS_PROCESS_GROUP
    from megatron.core import parallel_state

    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    if _OWNS_PROCESS_GROUP and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()
        _OWNS_PROCESS_GROUP = False
