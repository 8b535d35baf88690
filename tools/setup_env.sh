#!/usr/bin/env bash
# Create ./.venv with the CPU build of torch and megatron-mtp (editable, with test extras).
# Idempotent: a second run only checks. GPU clusters use an NGC container instead and install
# `pip install -e '.[gpu]'` there (torch and Transformer Engine come with the container).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
if ! .venv/bin/python -c "import megatron_mtp, torch, megatron.core, transformers, scipy" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  # Pinned first: an unpinned torch would pull a multi-GB CUDA build onto a CPU machine.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
fi
