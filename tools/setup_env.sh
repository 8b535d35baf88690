#!/usr/bin/env bash
# Create ./.venv with the CPU build of torch and megatron-mtp (editable, with test extras).
# Idempotent: a second run reinstalls only when pyproject.toml changed. GPU clusters use an NGC
# container instead and install `pip install -e '.[gpu]'` there (torch and Transformer Engine come
# with the container).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.megatron_mtp_pyproject.sha256
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! .venv/bin/python -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('megatron_mtp', 'torch', 'megatron.core')))" 2>/dev/null; then
  .venv/bin/python -m pip install -q --upgrade pip
  # Pinned first: an unpinned torch would pull a multi-GB CUDA build onto a CPU machine.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
