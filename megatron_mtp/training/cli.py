"""`megatron-mtp runs`. `train` is launch/train_command.py (it may start the ranks itself) and `eval` is
evaluate/cli.py (it may import an HF export first); both hand over to training/commands.py."""

from __future__ import annotations

from pathlib import Path


def register(subparsers) -> None:
    r = subparsers.add_parser("runs", help="look at runs: `runs show RUN` summarises one, `runs plot RUN` draws it")
    rsub = r.add_subparsers(dest="runs_command", metavar="ACTION")
    rsub.required = True
    show = rsub.add_parser("show", help="a run's steps, tokens, time, final and best losses, acceptance per "
                           "depth, throughput and checkpoints (what train prints when it finishes)")
    show.add_argument("run_dir", metavar="RUN", help="a run directory")
    show.add_argument("--json", action="store_true", help="print one JSON object")
    show.set_defaults(func=run_show)
    plot = rsub.add_parser("plot", help="draw a run's dashboard (losses, MTP acceptance, throughput, grad norm, MoE "
                           "balance against the step) into one SVG file")
    plot.add_argument("run_dir", metavar="RUN", help="a run directory")
    plot.add_argument("--out", help="the SVG file to write (default RUN/logs/dashboard.svg)")
    plot.set_defaults(func=run_plot)


def run_show(args) -> int:
    from megatron_mtp import strict_json
    from megatron_mtp.training.run_summary import format_summary, summarize

    summary = summarize(Path(args.run_dir))
    print(strict_json.dumps(summary) if args.json else format_summary(summary))
    return 0


def run_plot(args) -> int:
    from megatron_mtp.training.run_plot import plot_run

    out = plot_run(Path(args.run_dir), Path(args.out) if args.out else None)
    print(f"wrote {out}")
    return 0
