"""The `megatron-mtp` command: parses arguments and hands over to one capability.

Each capability folder has a small ``cli.py`` with ``register(subparsers)``; it must not import
torch or megatron-core at module level, so `megatron-mtp --help` stays instant.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from megatron_mtp.errors import EXIT_USAGE, UserError

# Modules that contribute subcommands, in the order they appear in --help.
_COMMAND_MODULES = (
    "megatron_mtp.launch.train_command",  # train
    "megatron_mtp.evaluate.cli",  # eval
    "megatron_mtp.training.cli",  # runs
    "megatron_mtp.data.cli",  # preprocess, tokenizer
    "megatron_mtp.convert.cli",  # convert, drop-mtp
    "megatron_mtp.inference.cli",  # generate
    "megatron_mtp.plan.cli",  # plan
    "megatron_mtp.launch.cli",  # submit
)


def build_parser() -> argparse.ArgumentParser:
    from megatron_mtp.models.family import supported_text

    parser = argparse.ArgumentParser(
        prog="megatron-mtp",
        description=f"Pretrain MoE models with Multi-Token Prediction: {supported_text()}.",
    )
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    subparsers.required = True
    for name in _COMMAND_MODULES:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:  # capability not present in this build
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:
        # dotted overrides may come after options (`train CFG --run-dir D a.b=1`)
        if hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = list(args.overrides or []) + extra
        else:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    from megatron_mtp.platform.known_warnings import silence_everywhere_harmless

    silence_everywhere_harmless()  # before a command imports megatron-core or torch
    try:
        result = args.func(args)
    except UserError as exc:
        if not exc.every_rank or os.environ.get("RANK", "0") == "0":  # a refusal all ranks share: printed once
            print(f"megatron-mtp {args.command}: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    except BrokenPipeError:  # output piped into `head` and the like
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(f"megatron-mtp {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
