"""`megatron-mtp plan`: memory, schedule and communication of a run before it is submitted."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "plan", help="predict per-rank GPU memory, pipeline schedule and communication of a run (no GPU needed)",
        description=("Computes, from the same config objects training uses, what every pipeline rank holds: "
                     "parameters, gradients and optimizer state (exact bytes), FP8 weight caches, saved "
                     "activations of the micro-batches in flight, pipeline outputs and a workspace allowance; "
                     "the pipeline bubble; bytes per step handed to each kind of collective. Every number "
                     "states its assumptions. Runs in seconds and starts no process group."))
    parser.add_argument("config", help="run config YAML")
    parser.add_argument("overrides", nargs="*", metavar="key.path=value", help="dotted config overrides")
    parser.add_argument("--nodes", type=int, default=1, help="nodes (default 1)")
    parser.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node; default: parallel.world_size / "
                                                          "--nodes")
    parser.add_argument("--gpu", help="h100 (default, SXM), h100-pcie, h100-nvl, h200, b200, gb200, or the memory "
                                      "of one GPU in GiB (e.g. 96)")
    parser.add_argument("--cpu", action="store_true",
                        help="plan a CPU (gloo) run instead: local specs and kernels, no capacity check")
    parser.add_argument("--routing-imbalance", type=float, default=1.0, metavar="F",
                        help="tokens the busiest expert-parallel rank receives over the balanced average (default 1)")
    parser.add_argument("--mfu", type=float, metavar="X",
                        help="model FLOPs utilisation (0-1) for a time estimate, as a share of the GPU's dense peak "
                             "for the run's precision: the FP8 peak when training.fp8 is set (twice the bf16 one, so "
                             "an MFU quoted against bf16 is halved here), else the bf16 peak")
    parser.add_argument("--json", action="store_true", help="print one strict JSON object instead of the table")
    small = parser.add_argument_group(
        "smallest layout", "--smallest searches instead for the fewest whole nodes of --gpus-per-node (default 8) "
        "--gpu GPUs, and the TP x PP x EP layouts there, that this plan says fit (plan/smallest.py)")
    small.add_argument("--smallest", action="store_true", help="print the smallest fitting world and its layouts")
    small.add_argument("--max-nodes", type=int, default=128, help="nodes to search up to (default 128)")
    spec = parser.add_argument_group(
        "speculative decoding", "--speculative predicts instead whether MTP drafts pay when serving this model "
        "on --gpu, by batch size and draft length (design note and assumptions: plan/speculative.py)")
    spec.add_argument("--speculative", nargs="?", const="0", default=None, metavar="K",
                      help="print the speculative-decoding prediction for K draft tokens per step (as K means in "
                      "generate and convert to-hf), or for K = 1, 2 and 3 when K is left out")
    spec.add_argument("--acceptance", default="0.85", metavar="A[,A2,...]",
                      help="acceptance of the draft at depth 1, 2, ... (the last repeats; default 0.85, "
                           "DeepSeek-V3's published second-token rate)")
    spec.add_argument("--serve-tp", type=int, default=1, help="tensor-parallel GPUs of the serving layout")
    spec.add_argument("--serve-ep", type=int, default=1, help="expert-parallel GPUs of the serving layout")
    spec.add_argument("--weight-bytes", type=float, default=1.0, help="bytes per weight element (1: FP8, 2: bf16)")
    spec.add_argument("--context", type=int, default=4096, help="tokens cached per sequence (default 4096)")
    parser.set_defaults(func=run_plan)


def run_speculative(args: argparse.Namespace, cfg) -> int:
    from megatron_mtp.config.vocab import resolve_vocab
    from megatron_mtp.errors import UserError
    from megatron_mtp.plan.speculative import ServeLayout, format_table, predict
    from megatron_mtp.platform.gpus import parse_gpu

    try:
        acceptance = [float(a) for a in args.acceptance.split(",")]
    except ValueError:
        raise UserError(f"--acceptance '{args.acceptance}' must be rates separated by commas (e.g. 0.9,0.8)") from None
    for flag, value in (("--serve-tp", args.serve_tp), ("--serve-ep", args.serve_ep), ("--context", args.context)):
        if value < 1:
            raise UserError(f"{flag} is {value}; it must be at least 1")
    if not args.weight_bytes > 0:
        raise UserError(f"--weight-bytes is {args.weight_bytes}; give the bytes of one weight (1 for FP8, 2 for bf16)")
    serve = ServeLayout(tp=args.serve_tp, ep=args.serve_ep, weight_bytes=args.weight_bytes, context=args.context)
    gpu = parse_gpu(args.gpu)
    drafts = {"drafts": (args.speculative,)} if args.speculative else {}
    rows = predict(cfg, resolve_vocab(cfg), gpu, acceptance, serve, **drafts)
    if args.json:
        from megatron_mtp import strict_json

        print(strict_json.dumps([{**r.__dict__, "speedup": r.speedup} for r in rows]))
    else:
        print(format_table(cfg, gpu, acceptance, serve, rows))
    return 0


def world_size(cfg, nodes: int, gpus_per_node: int | None) -> int:
    from megatron_mtp.errors import UserError

    if nodes < 1:
        raise UserError(f"--nodes is {nodes}; plan for at least one node")
    if gpus_per_node is None:
        if cfg.parallel.world_size is None:
            raise UserError("give --gpus-per-node (or set parallel.world_size) so the plan knows how many ranks "
                            "the run has")
        if cfg.parallel.world_size % nodes:
            raise UserError(f"parallel.world_size={cfg.parallel.world_size} is not divisible by --nodes {nodes}")
        return cfg.parallel.world_size
    if gpus_per_node < 1:
        raise UserError(f"--gpus-per-node is {gpus_per_node}; it must be at least 1")
    return nodes * gpus_per_node


def run_plan(args: argparse.Namespace) -> int:
    from megatron_mtp.config import load_config
    from megatron_mtp.errors import UserError
    from megatron_mtp.plan import report
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import parse_gpu

    for item in args.overrides:
        if "=" not in item:
            raise UserError(f"'{item}' is neither an option nor a key.path=value override")
    if args.mfu is not None and not 0 < args.mfu <= 1:
        raise UserError(f"--mfu {args.mfu} must be a fraction between 0 and 1 (e.g. 0.4)")
    if args.speculative is not None:  # an optional K: a key.path=value after the flag is an override
        if "=" in args.speculative:
            args.overrides = [*args.overrides, args.speculative]
            args.speculative = "0"
        if not args.speculative.isdigit():
            raise UserError(f"--speculative {args.speculative}: give the draft tokens per step as a number, or leave "
                            "it out for K = 1, 2 and 3")
        args.speculative = int(args.speculative)
    if args.smallest:
        from megatron_mtp.plan.smallest import smallest

        if args.speculative is not None:
            raise UserError("--smallest and --speculative are two different questions; ask one at a time")
        per_node = 8 if args.gpus_per_node is None else args.gpus_per_node  # 0 is refused, not the default
        return smallest(args.config, list(args.overrides), args.gpu or "h100", per_node, args.max_nodes)
    cfg = load_config(args.config, list(args.overrides))
    if args.speculative is not None:
        return run_speculative(args, cfg)
    gpu = parse_gpu(args.gpu)
    plan = make_plan(cfg, world_size(cfg, args.nodes, args.gpus_per_node), gpu, cpu=args.cpu,
                     imbalance=args.routing_imbalance)
    result = report.build(plan, mfu=args.mfu)
    print(report.to_json(result) if args.json else report.format_table(result))
    return 0
