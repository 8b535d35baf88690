"""Helper run on the test suite's ranks (or as python / torchrun): save or load a megatron torch_dist checkpoint.

save OUT: every rank saves its row shards of the tensors from ``global_tensors()`` (and, in a
single process, two chunks per tensor), plus optimizer-like state and an object, with
megatron.core.dist_checkpointing.save. load DIR: loads those tensors with megatron-core (as two
chunks per tensor) and checks them against ``global_tensors()``; prints OK.
"""

import os
import sys

import torch


def global_tensors() -> dict:
    g = torch.Generator().manual_seed(7)
    return {
        "decoder.layers.0.mlp.linear_fc2.weight": torch.randn(8, 6, generator=g),
        "embedding.word_embeddings.weight": torch.randn(12, 6, generator=g).to(torch.bfloat16),
        "decoder.layers.1.mlp.experts.experts.linear_fc1.weight": torch.randn(4, 10, 6, generator=g),
        "decoder.final_layernorm.weight": torch.randn(8, generator=g),
    }


def _init() -> bool:
    """Join the job (True when this script started the process group, and so ends it)."""
    from megatron_mtp.platform import cpu

    cpu.apply()  # megatron's checkpoint writer assumes CUDA (synchronize, current_device)
    if torch.distributed.is_initialized():  # a warm rank of the test suite (tests/workers)
        return False
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    torch.distributed.init_process_group("gloo")
    return True


def _shards(pieces: int, index_of: list[int]) -> dict:
    from megatron.core.dist_checkpointing.mapping import ShardedTensor

    out = {}
    for name, full in global_tensors().items():
        for i in index_of:
            rows = full.shape[0] // pieces
            local = full[i * rows : (i + 1) * rows].clone()
            out[f"{name}#{i}"] = ShardedTensor.from_rank_offsets(name, local, (0, i, pieces), replica_id=0)
    return out


def save(out: str) -> None:
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor

    rank, world = torch.distributed.get_rank(), torch.distributed.get_world_size()
    os.makedirs(out, exist_ok=True)
    torch.distributed.barrier()
    pieces = 2 * world
    sd = _shards(pieces, [2 * rank, 2 * rank + 1])
    sd["optimizer.state.exp_avg.decoder.final_layernorm.weight"] = ShardedTensor.from_rank_offsets(
        "optimizer.state.exp_avg.decoder.final_layernorm.weight", torch.full((6,), 9.0), replica_id=rank
    )
    sd["obj"] = ShardedObject("decoder.layers.0.mlp.linear_fc2._extra_state", [None], (1,), (0,), replica_id=rank)
    dist_checkpointing.save(sd, out)


def load(path: str) -> None:
    from megatron.core import dist_checkpointing

    loaded = dist_checkpointing.load(_shards(2, [0, 1]), path)
    for name, full in global_tensors().items():
        got = torch.cat([loaded[f"{name}#0"], loaded[f"{name}#1"]], dim=0)
        assert got.dtype == full.dtype and torch.equal(got, full), name
    print("OK")


if __name__ == "__main__":
    owned = _init()
    {"save": save, "load": load}[sys.argv[1]](sys.argv[2])
    torch.distributed.barrier()
    if owned:
        torch.distributed.destroy_process_group()
