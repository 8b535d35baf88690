"""`megatron-mtp convert to-hf|from-hf` and `megatron-mtp drop-mtp` (argument parsing only)."""

from __future__ import annotations

import argparse
import sys

from megatron_mtp.config.dtypes import dtype_arg

_LAYOUT_ALIASES = {"--tp": "parallel.tensor", "--pp": "parallel.pipeline", "--ep": "parallel.expert"}
"""from-hf's older layout flags: they only ever set these keys of the written config."""


def register(subparsers: argparse._SubParsersAction) -> None:
    convert = subparsers.add_parser("convert", help="convert checkpoints between megatron-core and Hugging Face")
    sub = convert.add_subparsers(dest="convert_command", metavar="DIRECTION")
    sub.required = True

    from megatron_mtp.models.family import supported_text

    to_hf = sub.add_parser("to-hf", help="megatron-mtp checkpoint -> Hugging Face directory of its family "
                           f"({supported_text()})")
    to_hf.add_argument("checkpoint", help="run directory, its checkpoints/ directory, a checkpoints/step_N "
                       "directory or the checkpoints/latest file")
    to_hf.add_argument("out", help="output directory (must not exist)")
    to_hf.add_argument("--for", dest="serve_for", metavar="vllm|sglang|transformers",
                       help="write the layout this engine loads with the fewest flags (--mtp inline, bf16) and "
                       "refuse what it cannot load or run; without it those facts are warnings")
    to_hf.add_argument("--mtp", choices=("separate", "inline", "none", "only"), default=None,
                       help="separate: OUT/main + OUT/mtp (default without --for); inline: release layout in OUT; "
                       "none: main only in OUT (what `megatron-mtp drop-mtp` does, the documented way); only: OUT "
                       "is the MTP directory alone (a new draft for an "
                       "unchanged base release; from-hf BASE OUT2 --mtp-dir OUT pairs them); a separate drafter "
                       "(assistant, EAGLE-3) goes where MTP layers go: OUT/mtp, or OUT with only")
    to_hf.add_argument("--mtp-layout", choices=("hf", "nextn"), default=None,
                       help="naming of OUT/mtp: hf = layer num_hidden_layers+i with embed/head copies (default); "
                       "nextn = SGLang NextN (one MTP module)")
    to_hf.add_argument("--dtype", type=dtype_arg(("bf16", "fp32", "fp8")), default=None, metavar="bf16|fp32|fp8",
                       help="weight dtype (default bf16; expert bias stays fp32); fp8: DeepSeek-V3's release "
                       "format, decoder-layer linears in float8_e4m3fn with 128x128 block scales, the rest bf16")
    to_hf.add_argument("--speculative", type=int, metavar="K",
                       help="draft tokens per step in the MTP serving commands (default: vLLM the MTP depth, "
                       "SGLang 3)")
    to_hf.add_argument("--max-shard-size", type=float, default=4.0, help="safetensors shard size in GiB (default 4)")
    to_hf.add_argument("--multimodal-from", metavar="DIR",
                       help="the multimodal checkpoint the model was imported from (Gemma 4's "
                       "Gemma4ForConditionalGeneration): the main directory is that model again, its towers copied "
                       "unchanged and the trained text model in its place")
    to_hf.set_defaults(func=run_to_hf)

    from_hf = sub.add_parser("from-hf", help=f"Hugging Face directory of {supported_text()} (and DeepSeek-V2) "
                             "-> megatron-mtp checkpoint")
    from_hf.add_argument("hf_dir",
                         help="HF model directory (bf16 or FP8 release), or a separate export with main/ and mtp/")
    from_hf.add_argument("out", help="output checkpoint directory (must not exist)")
    from_hf.add_argument("--mtp-dir", help="separate MTP directory (release or NextN naming; or a separate drafter's "
                         "directory: an assistant, a speculators EAGLE-3 drafter); its MTP tensors replace any the "
                         "main directory holds inline")
    from_hf.add_argument("--no-mtp", action="store_true", help="leave MTP layers out even if the source has them "
                         "(an alias of importing, then `megatron-mtp drop-mtp`, the documented way)")
    from_hf.add_argument("overrides", nargs="*", metavar="key.path=value",
                         help="dotted overrides of the training config written into OUT/config.yaml, as `train` takes "
                         "them (parallel.tensor=2 parallel.expert=4 optimizer.lr=1e-4 ...); the weights load at any "
                         "layout, the model section comes from the HF config")
    for flag, key in _LAYOUT_ALIASES.items():
        from_hf.add_argument(flag, type=int, default=None, help=f"alias of {key}=N (kept for older scripts)")
    from_hf.add_argument("--dtype", type=dtype_arg(("fp32", "bf16")), default="fp32", metavar="fp32|bf16",
                         help="dtype of the stored weights (default fp32)")
    from_hf.set_defaults(func=run_from_hf)

    drop = subparsers.add_parser("drop-mtp",
                                 help="remove the MTP layers from an HF directory or a megatron-mtp checkpoint")
    drop.add_argument("src", help="HF directory (inline or separate layout) or megatron-mtp run/checkpoint directory")
    drop.add_argument("out", help="output directory (must not exist)")
    drop.set_defaults(func=run_drop_mtp)


def run_to_hf(args: argparse.Namespace) -> int:
    from megatron_mtp.convert.serving import SERVING_FILE
    from megatron_mtp.convert.to_hf import export_to_hf

    out = export_to_hf(args.checkpoint, args.out, mtp=args.mtp, mtp_layout=args.mtp_layout, dtype=args.dtype,
                       max_shard_bytes=int(args.max_shard_size * (1 << 30)), serve_for=args.serve_for,
                       speculative=args.speculative, warn=lambda text: print(f"warning: {text}", file=sys.stderr),
                       multimodal_from=args.multimodal_from)
    print(f"wrote {out}\n")
    if args.mtp == "only":
        print(f"MTP weights alone: pair them with the base model by `megatron-mtp convert from-hf BASE OUT2 "
              f"--mtp-dir {out}`, or serve the base with this directory as its MTP draft")
        return 0
    print((out / SERVING_FILE).read_text(), end="")
    return 0


def run_from_hf(args: argparse.Namespace) -> int:
    from megatron_mtp.convert.from_hf import import_from_hf

    overrides = list(args.overrides)
    for flag, key in _LAYOUT_ALIASES.items():
        value = getattr(args, flag[2:])
        if value is not None:
            print(f"note: {flag} {value} is {key}={value}, the spelling every command takes", file=sys.stderr)
            overrides.insert(0, f"{key}={value}")
    out = import_from_hf(args.hf_dir, args.out, mtp_dir=args.mtp_dir, with_mtp=not args.no_mtp, dtype=args.dtype,
                         overrides=overrides)
    print(f"wrote {out}")
    return 0


def run_drop_mtp(args: argparse.Namespace) -> int:
    from megatron_mtp.convert.drop_mtp import drop_mtp

    out = drop_mtp(args.src, args.out)
    print(f"wrote {out}")
    return 0
