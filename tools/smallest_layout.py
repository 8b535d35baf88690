"""The smallest GPU count, and the layout at it, that `plan` says fits a config on a GPU kind.

    .venv/bin/python tools/smallest_layout.py configs/glm4_5.yaml --gpu h100 [key.path=value ...]

The same as `megatron-mtp plan CONFIG --smallest` (megatron_mtp/plan/smallest.py), kept as a caller.

The search is plan/smallest.py's (its module note says what it tries: TP x PP x EP x CP, even and
uneven pipeline splits, MTP on a stage of its own, the MoE all-to-all overlap off where it refuses a
layout, and how it prunes). Prints, for the first world size with a fitting layout, every fitting layout
by worst-rank memory and the command that reproduces the best one; each node count it plans is one
progress line on stderr.
"""

from __future__ import annotations

import argparse
import sys


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("config")
    ap.add_argument("overrides", nargs="*", help="dotted config overrides (e.g. mtp.freeze_base=true)")
    ap.add_argument("--gpu", default="h100", help="h100, h100-pcie, h100-nvl, h200, b200, gb200 or GiB")
    ap.add_argument("--gpus-per-node", type=int, default=8)
    ap.add_argument("--max-nodes", type=int, default=128)
    args = ap.parse_intermixed_args()

    from megatron_mtp.errors import UserError
    from megatron_mtp.plan.smallest import smallest

    try:
        return smallest(args.config, args.overrides, args.gpu, args.gpus_per_node, args.max_nodes)
    except UserError as exc:
        print(f"smallest_layout: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
