"""What megatron-core builds for the tiny config: parameter names and sizes, checkpoint keys.

Usage: built_model.py CONFIG OUT_JSON OVERRIDE...   (one process; vocabulary 256)
Writes {"params": [[name, numel], ...], "sharded_keys": [...], "chunk_params": [[name, numel], ...]}:
the model as build_model makes it, its sharded-state-dict tensor keys, and the first chunk of the
trainer's build_components (what plan/params.py counts).
"""

import json
import sys


def main(config: str, out: str, overrides: list[str]) -> None:
    from megatron.core.dist_checkpointing.dict_utils import nested_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory
    from megatron.core.transformer.utils import ensure_metadata_has_dp_cp_group

    from megatron_mtp.config import load_config
    from megatron_mtp.models.family import get_family
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components
    from megatron_mtp.training.distributed import destroy, init_distributed

    cfg = load_config(config, ["model.vocab_size=256", *overrides])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    try:
        family = get_family(cfg.model.family)
        model = family.build_model(cfg, family.build_transformer_config(cfg, plat), plat, 256, True, True)
        sd = model.sharded_state_dict(metadata=ensure_metadata_has_dp_cp_group({}))
        kinds = (ShardedTensor, ShardedTensorFactory)
        chunk = build_components(cfg, plat, 256, with_optimizer=False).model[0].module
        facts = {
            "params": [[n, p.numel()] for n, p in model.named_parameters()],
            "sharded_keys": sorted({v.key for v in nested_values(sd) if isinstance(v, kinds)}),
            "chunk_params": [[n, p.numel()] for n, p in chunk.named_parameters()],
        }
    finally:
        destroy()
    with open(out, "w") as fh:
        json.dump(facts, fh)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3:])
