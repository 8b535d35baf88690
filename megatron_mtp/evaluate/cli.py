"""`megatron-mtp eval`: a checkpoint's LM loss, MTP loss and acceptance per depth.

A Hugging Face export (FP8 included) given as the checkpoint, or as ``--compare``, is imported once into
a cache (convert/import_cache.py) and the checkpoint so made is evaluated by training/commands.py; that
import is why this command sits above convert/ while the evaluation itself sits in training/.
"""

from __future__ import annotations


def register(subparsers) -> None:
    e = subparsers.add_parser("eval", help="evaluate a checkpoint: LM loss, MTP loss and acceptance per depth")
    e.add_argument("checkpoint", help="run directory, checkpoints/ directory, step_* directory, or a Hugging Face "
                   "export (bf16, fp32 or fp8; imported once into a cache)")
    e.add_argument("overrides", nargs="*", metavar="key.path=value", help="dotted config overrides")
    e.add_argument("--json", action="store_true", help="print one JSON object")
    e.add_argument("--text-file", help="evaluate on this plain text file instead of the validation split")
    e.add_argument("--steps", type=int, default=None,
                   help="global batches of the validation split (default: logging.eval_steps)")
    e.add_argument("--compare", metavar="CHECKPOINT",
                   help="also evaluate this checkpoint on the same tokens and print both side by side (e.g. an "
                   "MTP-only run and the model it was loaded from: acceptance per depth before and after)")
    e.set_defaults(func=run_eval)


def run_eval(args) -> int:
    from megatron_mtp.platform.detect import detect
    from megatron_mtp.platform.known_warnings import silence_known_harmless

    silence_known_harmless(detect())  # before the checkpoint's reading imports megatron-core, as train does
    from megatron_mtp.convert.import_cache import checkpoint_of
    from megatron_mtp.training.commands import eval_main

    compare = checkpoint_of(args.compare) if args.compare else None
    return eval_main(checkpoint_of(args.checkpoint), list(args.overrides), as_json=args.json,
                     text_file=args.text_file, steps=args.steps, compare=compare)
