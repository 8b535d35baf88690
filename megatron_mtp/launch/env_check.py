"""Check, inside the job's image (or on its nodes), that the packages training needs are importable
and in the tested ranges, before any rank starts.

The job script runs ``python -m megatron_mtp.launch.env_check [--te]`` as one task with the same
container flags as the ranks. It prints one sentence and exits 2 when something is missing or out of
range, so a job on an image with the wrong megatron-core fails in seconds with the reason instead of
after an allocation's worth of start-up (or, worse, training on an untested line). ``--te``: the job
runs on GPUs, where Transformer Engine is expected (FP8, the fused kernels); it must import.
Nothing here imports torch at module level: a missing torch is one of the answers.
"""

from __future__ import annotations

import argparse
import sys

from megatron_mtp.errors import EXIT_USAGE, UserError

TORCH_RANGE = ((2, 6), (2, 15))
"""torch versions tested: from 2.6 up to, not including, 2.15 (pyproject.toml's pin)."""
TORCH_RANGE_TEXT = "2.6 to <2.15"
TE_MIN = (2, 0)
"""Transformer Engine: 2.0 or newer (the `gpu` extra's pin)."""


def check_environment(need_te: bool) -> list[str]:
    """What this interpreter reports, one line a package; raises UserError on the first problem."""
    from importlib.metadata import PackageNotFoundError, version

    from megatron_mtp.platform.megatron_core import check_supported, major_minor

    where = f"the job's Python {sys.version.split()[0]} ({sys.executable})"
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        raise UserError(f"torch is not installed in {where}; use an image with torch {TORCH_RANGE_TEXT}") from None
    low, high = TORCH_RANGE
    if not low <= major_minor(torch_version) < high:
        raise UserError(f"torch {torch_version} in {where} is outside the tested range {TORCH_RANGE_TEXT}; "
                        "use an image with a tested torch")
    try:
        check_supported()
    except UserError as exc:
        raise UserError(f"{exc} (in {where})") from None
    found = [f"torch {torch_version}", f"megatron-core {version('megatron-core')}"]
    if need_te:
        try:
            te_version = version("transformer-engine")
        except PackageNotFoundError:
            try:
                te_version = version("transformer_engine")
            except PackageNotFoundError:
                raise UserError(f"Transformer Engine is not installed in {where}; use an image with transformer-"
                                f"engine >= {TE_MIN[0]}.{TE_MIN[1]} (NGC PyTorch containers have it)") from None
        if major_minor(te_version) < TE_MIN:
            raise UserError(f"Transformer Engine {te_version} in {where} is older than the tested "
                            f"{TE_MIN[0]}.{TE_MIN[1]}; use a newer image")
        try:
            import transformer_engine.pytorch  # noqa: F401
        except Exception as exc:  # a CUDA-less or broken install
            raise UserError(f"Transformer Engine {te_version} is installed in {where} but does not import "
                            f"({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}); "
                            "check the image's CUDA libraries") from None
        found.append(f"transformer-engine {te_version}")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m megatron_mtp.launch.env_check")
    parser.add_argument("--te", action="store_true", help="Transformer Engine must import too (GPU jobs)")
    args = parser.parse_args(argv)
    try:
        found = check_environment(args.te)
    except UserError as exc:
        print(f"megatron-mtp job environment: error: {exc}", file=sys.stderr, flush=True)
        return EXIT_USAGE
    print("megatron-mtp job environment: " + ", ".join(found), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
