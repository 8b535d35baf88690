"""One dtype vocabulary for every command's --dtype: fp32, bf16, fp16, fp8 (each command takes the
ones it can write). The torch spellings (float32, bfloat16, float16, half, float) still work, with a
one-line note naming the new one."""

from __future__ import annotations

import argparse
import sys

OLD_SPELLINGS = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


def dtype_arg(allowed: tuple[str, ...]):
    """An argparse `type=` for --dtype taking `allowed` (canonical names) and their old spellings."""

    def parse(text: str) -> str:
        name = OLD_SPELLINGS.get(text.lower(), text.lower())
        if name not in allowed:
            raise argparse.ArgumentTypeError(f"'{text}' is not one of {', '.join(allowed)}")
        if name != text:
            print(f"note: --dtype {text} is spelled {name} in every command now (the old spelling still works)",
                  file=sys.stderr)
        return name

    parse.__name__ = "dtype"
    return parse
