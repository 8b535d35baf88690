"""megatron-core's MTP roll (``roll_tensor``) over a context-parallel group of every rank, on CPU/gloo.

Each rank holds chunks r and 2CP - 1 - r of a sequence (megatron-core's load-balanced split); rolling
its local part by one (and again, as MTP depth 2 rolls its labels twice) must give that rank's chunks of
the whole sequence rolled on one rank, the positions rolled past the end zero, and the per-rank sums
must add up to the whole sum. The evaluation's LM sums (training/evaluation.py ``lm_totals``) of what the loss
function reports on each rank (training/forward_step.py) add up over the job to the whole micro-batches' loss
and scored tokens, once. Prints CPROLL OK on rank 0."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]


def local_part(full: torch.Tensor, rank: int, cp: int) -> torch.Tensor:
    chunks = full.chunk(2 * cp, dim=-1)
    return torch.cat([chunks[rank], chunks[2 * cp - 1 - rank]], dim=-1)


def _evaluation_counts(full: torch.Tensor, rank: int, world: int, group) -> None:
    """Two micro-batches of per-token losses ``full`` with a mask scoring some positions: the job-wide sums of
    each rank's ``lm_totals`` are the whole loss sum and token count of both, not CP times them."""
    from megatron_mtp.training.distributed import Ranks
    from megatron_mtp.training.evaluation import lm_totals
    from megatron_mtp.training.forward_step import masked_lm_loss

    mask = (full.long() % 3 != 0).float()
    reported = [masked_lm_loss(local_part(mask, rank, world), local_part(full, rank, world), group)[1]
                for _ in range(2)]
    ranks = Ranks(rank=rank, world_size=world, tp=1, pp=1, ep=1, dp=1, tp_rank=0, pp_rank=0, ep_rank=0, dp_rank=0,
                  cp=world, cp_rank=torch.distributed.get_rank(group))
    totals = torch.tensor(lm_totals(reported, ranks), dtype=torch.float64)
    torch.distributed.all_reduce(totals)
    want = (2 * float((full * mask).sum()), 2 * float(mask.sum()))
    assert tuple(totals.tolist()) == want, (rank, totals.tolist(), want)


def main() -> None:
    from megatron.core import parallel_state
    from megatron.core.transformer.multi_token_prediction import roll_tensor

    from megatron_mtp.config import load_config
    from megatron_mtp.platform.detect import setup
    from megatron_mtp.training.distributed import destroy, env_world, init_distributed

    rank, world = env_world()
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), [f"parallel.context={world}"])
    init_distributed(cfg, setup("cpu", "gloo"))
    group = parallel_state.get_context_parallel_group()
    assert torch.distributed.get_world_size(group) == world
    b, s = 3, 8 * world
    full = torch.arange(1, b * s + 1, dtype=torch.float32).view(b, s)
    local = local_part(full, rank, world)
    for depth in (1, 2):
        local, total = roll_tensor(local, shifts=-1, dims=-1, cp_group=group)
        want = torch.roll(full, -depth, dims=-1)
        want[:, s - depth:] = 0
        assert torch.equal(local, local_part(want, rank, world)), (rank, depth, local, local_part(want, rank, world))
        torch.distributed.all_reduce(total)
        assert float(total) == float(want.sum()), (depth, float(total), float(want.sum()))
    _evaluation_counts(full, rank, world, group)
    if rank == 0:
        print("CPROLL OK", flush=True)
    destroy()


if __name__ == "__main__":
    sys.exit(main())
