#!/usr/bin/env bash
# Create a virtual environment with torch and megatron-mtp (editable, with test extras), for one of
# the two tested lines:
#   tools/setup_env.sh                 -> .venv        (python3: Python 3.11, megatron-core 0.16.x)
#   tools/setup_env.sh python3.12      -> .venv-py312  (Python 3.12, megatron-core 0.19.x)
# The interpreter is a command or a path; a version that is not on PATH is looked up under
# `pyenv root`. pip picks megatron-core's line from the Python version (pyproject.toml).
# The 3.12 environment carries torch's CUDA build (about 5 GB, the only one the index serves for
# 3.12), so it is made once per machine under $MEGATRON_MTP_VENVS (default
# ~/.cache/megatron_mtp/venvs) and linked as .venv-py312; every checkout re-points its editable
# install at itself (a few seconds) instead of installing torch again.
# Idempotent: a second run reinstalls only when pyproject.toml changed. GPU clusters use an NGC
# container instead and install `pip install -e '.[gpu]'` there (torch and Transformer Engine come
# with the container).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-${PYTHON:-python3}}
if ! "$PY" -c "" 2>/dev/null; then
  found=""
  want=${PY##*python}
  if [[ "$PY" != */* && -n "$want" ]] && command -v pyenv >/dev/null 2>&1; then
    for cand in "$(pyenv root)"/versions/"$want"*/bin/python"$want"; do
      [ -x "$cand" ] && found=$cand
    done
  fi
  if [ -z "$found" ]; then
    echo "setup_env.sh: interpreter '$PY' was not found (nor under pyenv root); pass a path to python3.11 or python3.12" >&2
    exit 2
  fi
  PY=$found
fi
minor=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
shared=""
case "$minor" in
  311|310) VENV=${VENV:-.venv} ;;
  312) VENV=${VENV:-.venv-py312}; shared=${MEGATRON_MTP_VENVS:-$HOME/.cache/megatron_mtp/venvs}/py312 ;;
  *) echo "setup_env.sh: $("$PY" --version) is not a tested Python; use 3.11 (megatron-core 0.16) or 3.12 (0.19)" >&2
     exit 2 ;;
esac
if [ -n "$shared" ] && [ ! -e "$VENV" ]; then
  mkdir -p "$(dirname "$shared")"
  [ -x "$shared/bin/python" ] || "$PY" -m venv "$shared"
  ln -s "$shared" "$VENV"
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PY" -m venv "$VENV"
fi
stamp=$VENV/.megatron_mtp_pyproject.sha256
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ] || ! "$VENV/bin/python" -I -c "import importlib.util as u, sys; sys.exit(not all(u.find_spec(m) for m in ('megatron_mtp', 'torch', 'megatron.core')))" 2>/dev/null; then
  echo "setup_env.sh: installing into $VENV ($("$PY" --version))" >&2
  "$VENV/bin/python" -m pip install -q --upgrade pip
  # Pinned first: an unpinned torch would pull a newer build. Python 3.11 gets the CPU build (a local
  # file on these machines); for 3.12 the index serves only the CUDA build, which runs on CPU too.
  "$VENV/bin/python" -m pip install -q "torch==2.13.0"
  "$VENV/bin/python" -m pip install -q -e ".[test]"
  echo "$want" > "$stamp"
fi
# speculators, whose EAGLE-3 model code is the reference of tests/convert/test_eagle3_speculators.py, pins
# transformers<=5.19 while the test extras take 5.25; its model code runs on 5.25, so it is installed without its
# dependencies, with the few it imports at module level (without it those tests skip, saying why)
if ! "$VENV/bin/python" -I -c "import speculators.models.eagle3" >/dev/null 2>&1; then
  "$VENV/bin/python" -m pip install -q --no-deps "speculators==0.9.0" pydantic-settings loguru python-dotenv \
    typing-inspection openai hs-connectors ||
    echo "setup_env.sh: speculators 0.9.0 did not install; the EAGLE-3 reference tests will skip" >&2
fi
# An environment shared between checkouts imports the package from this one. The checks run with
# -I: without it the current directory (this checkout) is on sys.path and hides where the installed
# package really points.
imported_from() {
  "$VENV/bin/python" -I -c 'import megatron_mtp, os; print(os.path.dirname(os.path.dirname(os.path.realpath(megatron_mtp.__file__))))' 2>/dev/null
}
if [ "$(imported_from)" != "$(pwd -P)" ]; then
  "$VENV/bin/python" -m pip install -q --no-deps -e .
  if [ "$(imported_from)" != "$(pwd -P)" ]; then
    echo "setup_env.sh: $VENV imports megatron_mtp from '$(imported_from)', not from $(pwd -P), even after reinstalling it; remove $VENV and run this script again" >&2
    exit 1
  fi
fi
