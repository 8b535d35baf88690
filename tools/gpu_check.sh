#!/usr/bin/env bash
# GPU check: train the tiny model for a few steps in bf16 and in FP8 (delayed, tensorwise,
# blockwise recipes through Transformer Engine) and print losses and step times.
#   tools/gpu_check.sh [OUT_DIR] [STEPS]
# Needs one CUDA GPU. Without Transformer Engine the bf16 run uses local specs and each FP8 run
# must end in one clear error sentence (that is checked and reported too).
set -uo pipefail
OUT=${1:-${OUT:-/tmp/megatron_mtp_gpu_check}}
STEPS=${2:-20}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
echo "== environment"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpu', torch.cuda.is_available())"
if $PY -c "import transformer_engine.pytorch as te; import transformer_engine; print('transformer_engine', transformer_engine.__version__)"; then
  HAVE_TE=1
else
  HAVE_TE=0; echo "transformer_engine: NOT installed (FP8 runs are expected to fail with a clear error)"
fi
# FP8 GEMMs want dimensions in multiples of 16 (blockwise: 128): widen the tiny model a little.
COMMON="training.device=cuda training.precision=bf16 logging.log_interval=1 logging.eval_interval=0 \
  checkpoint.save_interval=0 model.hidden_size=256 model.ffn_hidden_size=512 model.moe_ffn_hidden_size=128 \
  model.q_lora_rank=128 model.kv_lora_rank=128 model.qk_head_dim=64 model.qk_pos_emb_head_dim=64 model.v_head_dim=64"
for recipe in none delayed tensorwise blockwise; do
  run="$OUT/run_$recipe"; rm -rf "$run"
  fp8=$([ "$recipe" = none ] && echo "training.fp8=null" || echo "training.fp8=$recipe")
  echo "== bf16 + fp8=$recipe"
  $PY -m megatron_mtp train configs/tiny_cpu.yaml --run-dir "$run" --max-steps "$STEPS" $COMMON $fp8 \
      > "$OUT/$recipe.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "exit code $rc; last lines:"; grep -v Warning "$OUT/$recipe.log" | tail -n 4
    continue
  fi
  $PY - "$run/logs/metrics.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train/lm_loss"' in l]
times = [r["perf/step_time_s"] for r in rows[3:]] or [r["perf/step_time_s"] for r in rows]
print(f"lm_loss {rows[0]['train/lm_loss']:.4f} -> {rows[-1]['train/lm_loss']:.4f}  "
      f"mtp_loss {rows[0]['train/mtp_loss_1']:.4f} -> {rows[-1]['train/mtp_loss_1']:.4f}  "
      f"median step {statistics.median(times)*1e3:.1f} ms  tokens/s {statistics.median(r['perf/tokens_per_s'] for r in rows[3:] or rows):.0f}  "
      f"memory {rows[-1]['perf/memory_gib']:.2f} GiB")
PY
done
echo "HAVE_TE=$HAVE_TE"
