"""An EAGLE-3 drafter of a checkpoint -> a speculators directory (hf.py), the target's embedding table written
with it: ``python -m megatron_mtp.mtp_styles.eagle3.export CHECKPOINT OUT [--verifier PATH_OR_ID] [--dtype
bf16|fp32] [--speculative K]``. ``convert to-hf --mtp none`` exports the target beside it; the verifier named in
config.json is that export (or the release the target was imported from), which speculators and vLLM read."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Optional

import torch

from megatron_mtp.errors import UserError
from megatron_mtp.mtp_styles.eagle3 import hf
from megatron_mtp.mtp_styles.eagle3.shape import PREFIX, drafter_shape

DTYPES = {"bf16": (torch.bfloat16, "bfloat16"), "fp32": (torch.float32, "float32")}
EMBEDDING = "embedding.word_embeddings.weight"


def export_drafter(ckpt_path, out_dir, verifier: Optional[str] = None, dtype: str = "bf16",
                   speculative: Optional[int] = None) -> Path:
    """Write the drafter of the checkpoint ``ckpt_path`` (a run or step directory) to ``out_dir``."""
    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
    from megatron_mtp.models.family import get_family
    from megatron_mtp.output import check_output_free

    if dtype not in DTYPES:
        raise UserError(f"--dtype must be {' or '.join(DTYPES)}, not {dtype!r}")
    out = Path(out_dir).absolute()
    check_output_free(out)
    step = resolve_checkpoint(ckpt_path).path
    cfg = read_config(step)
    if cfg.mtp.style != "eagle3" or not cfg.mtp.num_layers:
        raise UserError(f"checkpoint '{step}' has no EAGLE-3 drafter (mtp.style={cfg.mtp.style}, mtp.num_layers="
                        f"{cfg.mtp.num_layers}); export it with `megatron-mtp convert to-hf`")
    with TorchDistReader(step) as reader:
        ours = {k[len(PREFIX):]: reader.read(k) for k in reader.keys() if k.startswith(PREFIX)}
        embedding = reader.read(EMBEDDING)
    shape = drafter_shape(cfg)
    torch_dtype, name = DTYPES[dtype]
    config = hf.speculators_config(shape, speculative or cfg.mtp.num_layers, name, cfg.training.seq_length, verifier,
                                   [get_family(cfg.model.family).architecture])
    return hf.write_dir(out, config, hf.to_speculators(ours, embedding, shape), torch_dtype)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megatron_mtp.mtp_styles.eagle3.export", description=__doc__)
    parser.add_argument("checkpoint")
    parser.add_argument("out")
    parser.add_argument("--verifier", default=None, help="the target's HF directory or hub id (config.json's verifier)")
    parser.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    parser.add_argument("--speculative", type=int, default=None, help="draft tokens per round (default: the steps "
                        "trained, mtp.num_layers)")
    args = parser.parse_args(argv)
    try:
        print(export_drafter(args.checkpoint, args.out, args.verifier, args.dtype, args.speculative))
    except UserError as exc:
        print(f"error: {exc}")
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
