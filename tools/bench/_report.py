"""What the decoding benchmarks share: writing their JSON report whole (a temp file renamed), and the
entry point that turns a UserError into one line and exit 2."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Callable


def write_json(path: str, report: dict[str, Any]) -> None:
    out = Path(path)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(report, indent=2))
    tmp.rename(out)


def cli_main(name: str, run: Callable[[list[str] | None], Any], argv: list[str] | None = None) -> int:
    from megatron_mtp.errors import UserError

    try:
        run(argv)
    except UserError as exc:
        print(f"{name}: error: {exc}", file=sys.stderr)
        return 2
    return 0
