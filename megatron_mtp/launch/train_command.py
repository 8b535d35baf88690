"""`megatron-mtp train`: one rank started for it (by torchrun or `megatron-mtp submit`), or, with
``--nproc-per-node N``, N ranks started here by the local launcher (local.py).

The command sits with the launcher because it may launch; the training itself is training/commands.py,
which imports nothing of launch/.
"""

from __future__ import annotations

import os
from pathlib import Path

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"


def register(subparsers) -> None:
    p = subparsers.add_parser("train", help="train a model (resumes from the run directory's latest checkpoint)")
    p.add_argument("config", nargs="?", help="YAML config (default: configs/tiny_cpu.yaml)")
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="dotted config overrides")
    p.add_argument("--run-dir", help="run directory (default: runs/<config name>)")
    p.add_argument("--max-steps", type=int, help="same as training.max_steps=N")
    p.add_argument("--nproc-per-node", type=int, default=None,
                   help="start this many ranks on this machine, one process each (the command launches them "
                   "itself; omit it when the ranks are started for you, by torchrun or by `megatron-mtp submit`)")
    p.add_argument("--max-restarts", type=int, default=0,
                   help="with --nproc-per-node: start the job again from the latest checkpoint after a rank dies "
                   "or hangs, up to N times (default 0)")
    p.add_argument("--print-config", action="store_true", help="print the resolved config and exit")
    p.add_argument("--help-config", action="store_true", help="list every config key with its type and meaning")
    p.set_defaults(func=run_train)


def _split_config_arg(args) -> tuple[str | None, list[str]]:
    # `train key=value` without a config: the first positional is an override
    config, overrides = args.config, list(args.overrides)
    if config is not None and "=" in config and not os.path.exists(config):
        overrides.insert(0, config)
        config = None
    return config or str(DEFAULT_CONFIG), overrides


def run_train(args) -> int:
    from megatron_mtp.config import load_config
    from megatron_mtp.errors import UserError, same_on_every_rank

    if args.help_config:
        from megatron_mtp.config.base import describe
        from megatron_mtp.config.root import Config

        for key, type_name, doc in describe(Config):
            print(f"{key} ({type_name})\n    " + doc.replace("\n", "\n    "))
        return 0
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise UserError(f"--nproc-per-node is {args.nproc_per_node}; it must be 1 or more (processes on this machine)")
    if args.max_restarts < 0:
        raise UserError(f"--max-restarts is {args.max_restarts}; give 0 or more")
    config_path, overrides = _split_config_arg(args)
    if args.max_steps is not None:
        overrides.append(f"training.max_steps={args.max_steps}")
    if Path(config_path).is_file():  # every rank reads the same file and overrides: one refusal, printed once
        with same_on_every_rank():
            cfg = load_config(config_path, overrides)
    else:  # a file missing on this rank's machine alone is this rank's to say
        cfg = load_config(config_path, overrides)
    if args.print_config:
        from megatron_mtp.config.validate import validate

        validate(cfg, args.nproc_per_node)
        print(cfg.to_yaml(), end="")
        return 0
    in_job = "RANK" in os.environ and "WORLD_SIZE" in os.environ
    if args.nproc_per_node and args.nproc_per_node > 1 and not in_job:
        from megatron_mtp.config.validate import validate
        from megatron_mtp.launch.local import run_local

        validate(cfg, args.nproc_per_node)
        run_dir = Path(args.run_dir or Path("runs") / cfg.name).resolve()
        argv = ["train", config_path, *overrides, "--run-dir", str(run_dir)]
        return run_local(args.nproc_per_node, argv, args.max_restarts, run_dir)
    if args.nproc_per_node and in_job and int(os.environ["WORLD_SIZE"]) % args.nproc_per_node:
        raise UserError("--nproc-per-node does not match the job this process was launched in")
    run_dir = Path(args.run_dir or Path("runs") / cfg.name)
    from megatron_mtp.training.commands import train_main

    return train_main(cfg, run_dir)
