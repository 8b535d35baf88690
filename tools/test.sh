#!/usr/bin/env bash
# Lint and the test suite on both tested megatron-core lines (what .ci/run runs):
#   lane 1, Python 3.11 + megatron-core 0.16: ruff and the whole default suite, including
#           tests/lines, which runs the 3.12 environment beside it (losses, MTP gradients, acceptance,
#           checkpoints resumed across the lines both ways, conversion bytes);
#   lane 2, Python 3.12 + megatron-core 0.19: the tests marked `mcore` (model build, train layouts,
#           MTP loss and acceptance, frozen base, save/resume/reshard, conversion; README "Tests").
# Both environments come from tools/setup_env.sh (the 3.12 one is shared between checkouts).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup_env.sh
tools/setup_env.sh python3.12
.venv/bin/ruff check .
export MEGATRON_MTP_BOTH_LINES=1
echo "== lane 1: $(.venv/bin/python --version), megatron-core $(.venv/bin/python -c 'from importlib.metadata import version; print(version("megatron-core"))')"
.venv/bin/python -m pytest -m "not slow" -q
echo "== lane 2: $(.venv-py312/bin/python --version), megatron-core $(.venv-py312/bin/python -c 'from importlib.metadata import version; print(version("megatron-core"))')"
.venv-py312/bin/python -m pytest -m "mcore and not slow" -q -p no:cacheprovider --ignore=tests/lines
