"""The initial weights a layout builds from scratch, as checkpoint-key slices.

Usage: initial_weights.py CONFIG OUT_DIR OVERRIDE...   (any number of ranks)
Each rank writes OUT_DIR/rank-R.pt: a list of (key, prepended index, global shape, global offset,
tensor) for every parameter shard of its model chunks, built as the trainer builds them.
"""

import sys
from pathlib import Path


def main(config: str, out: str, overrides: list[str]) -> None:
    import torch
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factories
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    from megatron_mtp.config import load_config
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed

    cfg = load_config(config, ["model.vocab_size=256", *overrides])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    try:
        shards = []
        for chunk in build_components(cfg, plat, 256, with_optimizer=False).model:
            model = unwrap(chunk)
            params = {p.untyped_storage().data_ptr() for p in model.parameters()}
            sd = model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
            apply_factories(sd)
            for sh in nested_values(sd):
                if isinstance(sh, ShardedTensor) and sh.data.untyped_storage().data_ptr() in params:
                    n = sh.prepend_axis_num
                    shards.append((sh.key, tuple(sh.global_offset[:n]), tuple(sh.global_shape[n:]),
                                   tuple(sh.global_offset[n:]), sh.data.detach().float().clone()))
        rank = torch.distributed.get_rank()
    finally:
        destroy()
    Path(out).mkdir(parents=True, exist_ok=True)
    torch.save(shards, Path(out) / f"rank-{rank}.pt")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
