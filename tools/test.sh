#!/usr/bin/env bash
# Lint and the test suite on both tested megatron-core lines (what .ci/run runs):
#   lane 1, Python 3.11 + megatron-core 0.16: ruff and the whole default suite, in three pytest processes at
#           once (its Slurm tests, which wait on the local cluster more than they compute; the in-process tests
#           and a few long multi-rank files; the rest of the multi-rank tests);
#   lane 2, Python 3.12 + megatron-core 0.19: the tests marked `mcore` (model build, train layouts,
#           MTP loss and acceptance, frozen base, save/resume/reshard, conversion; README "Tests");
#   then tests/lines, which runs both environments side by side (losses, MTP gradients, acceptance,
#           checkpoints resumed across the lines both ways, conversion bytes).
# Both environments come from tools/setup_env.sh (the 3.12 one is shared between checkouts).
#
# The lanes run at the same time: the suite keeps about one of two cores busy on average (process
# start-ups, rendezvous, the Slurm cluster's scheduling), so lane 2, and before it the 3.12
# environment's download, fill the other. Lane 2 runs at the lowest CPU priority (nice 19): it takes
# the cycles lane 1 leaves, and lane 1, the default suite whose time is budgeted, keeps both cores
# whenever its multi-rank tests need them. Each lane has its own worker pool, cache and free ports;
# lane 2's output is printed when it ends. The exit status is non-zero if any part failed.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup_env.sh || exit 1
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT
(
  # DeepSpeed's CPUAdam is built by JIT the first time on a machine (about 40 s, then cached under
  # ~/.cache/torch_extensions): build it here, beside lane 1, which waits on torch's build lock if it
  # gets to its DeepSpeed test first
  .venv/bin/python -c 'import torch; from deepspeed.ops.adam import DeepSpeedCPUAdam as A; A([torch.nn.Parameter(torch.zeros(1))])' \
    >"$logs/deepspeed" 2>&1 || echo "(DeepSpeed's CPUAdam was not built ahead: see its test)" >>"$logs/deepspeed"
  renice -n 19 -p "$BASHPID" >/dev/null  # the rest of lane 2 at the lowest priority (header)
  tools/setup_env.sh python3.12 >"$logs/setup312" 2>&1 || { echo "setup of the Python 3.12 environment failed"; exit 3; }
  echo "== lane 2: $(.venv-py312/bin/python --version), megatron-core $(.venv-py312/bin/python -c 'from importlib.metadata import version; print(version("megatron-core"))')"
  .venv-py312/bin/python -m pytest -m "mcore and not slow" -q -p no:cacheprovider --ignore=tests/lines
) >"$logs/lane2" 2>&1 &
lane2=$!
status=0
.venv/bin/ruff check . || status=1
export MEGATRON_MTP_BOTH_LINES=1
lane1_start=$SECONDS
# lane 1's Slurm tests (tests/slurm) run beside the rest of it, in a pytest of their own: they mostly wait on
# the local cluster's scheduling (a requeue, a job's start), so the rest of lane 1 keeps the CPU meanwhile
.venv/bin/python -m pytest -m "not slow" -q -p no:cacheprovider tests/slurm >"$logs/slurm" 2>&1 &
slurm_lane=$!
# the rest of lane 1 in two pytest processes at once, each with its own warm ranks: the multi-rank tests
# (tests/dist) wait on process start-ups and rendezvous for about half their time, which the in-process tests
# (unit, conversion, decoding, data) fill. Measured in .ci/run on a clean clone (2026-12-07): tests/dist without
# three of its files 1,002 s beside the rest with them 1,383 s, so those three files (about 200 s) are back
# with tests/dist, which makes the halves about even
side=(tests/unit tests/convert tests/inference tests/data)
.venv/bin/python -m pytest -m "not slow" -q -p no:cacheprovider "${side[@]}" >"$logs/side" 2>&1 &
side_lane=$!
echo "== lane 1: $(.venv/bin/python --version), megatron-core $(.venv/bin/python -c 'from importlib.metadata import version; print(version("megatron-core"))')"
.venv/bin/python -m pytest -m "not slow" -q --ignore=tests/lines --ignore=tests/slurm "${side[@]/#/--ignore=}" || status=1
wait "$side_lane" || status=1
echo "== lane 1, ${side[*]} (beside the rest of lane 1)"
cat "$logs/side"
wait "$slurm_lane" || status=1
echo "== lane 1, tests/slurm (beside the rest of lane 1)"
cat "$logs/slurm"
echo "== lane 1 took $((SECONDS - lane1_start)) s, its three pytest processes together (the default suite's budget: 1,500 s)"
wait "$lane2" || status=1
cat "$logs/setup312" "$logs/lane2"
if [ -x .venv-py312/bin/python ]; then
  echo "== both lines: tests/lines"
  .venv/bin/python -m pytest -m "not slow" -q -p no:cacheprovider tests/lines || status=1
else
  status=1
fi
exit "$status"
