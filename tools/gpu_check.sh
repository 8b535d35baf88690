#!/usr/bin/env bash
# GPU check: train the tiny model for a few steps in bf16 and in FP8 (delayed, tensorwise,
# blockwise recipes through Transformer Engine), then with the memory/throughput controls that
# run on one GPU (recompute, optimizer offload, async checkpoints, manual GC, and with Transformer
# Engine its fused kernels), the GPU-only controls (shared-expert overlap, CUDA graphs, padded token
# dropping; with Transformer Engine TE graphs, bf16 first/last layers and the Blackwell recipes where the
# GPU has them), and print losses, step times and memory.
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
report() {  # NAME RUN_DIR: losses, median step time, tokens/s and peak memory of a finished run
  $PY - "$2/logs/metrics.jsonl" "$1" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"train/lm_loss"' in l]
late = rows[3:] or rows
print(f"{sys.argv[2]:22s} lm_loss {rows[0]['train/lm_loss']:.4f} -> {rows[-1]['train/lm_loss']:.4f}  "
      f"median step {statistics.median(r['perf/step_time_s'] for r in late) * 1e3:.1f} ms  "
      f"tokens/s {statistics.median(r['perf/tokens_per_s'] for r in late):.0f}  "
      f"memory {max(r['perf/memory_gib'] for r in rows):.2f} GiB")
PY
}
run_case() {  # NAME OVERRIDES...
  name=$1; shift
  run="$OUT/run_$name"; rm -rf "$run"
  $PY -m megatron_mtp train configs/tiny_cpu.yaml --run-dir "$run" --max-steps "$STEPS" $COMMON "$@" \
      > "$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -ne 0 ]; then
    echo "$name: exit code $rc; last lines:"; grep -v Warning "$OUT/$name.log" | tail -n 4
  else
    report "$name" "$run"
  fi
}
echo "== bf16 and FP8 recipes"
for recipe in none delayed tensorwise blockwise; do
  fp8=$([ "$recipe" = none ] && echo "training.fp8=null" || echo "training.fp8=$recipe")
  run_case "fp8_$recipe" $fp8
done
echo "== memory and throughput controls (bf16; with TE the fused kernels are on by auto)"
run_case recompute_selective recompute.granularity=selective "recompute.modules=[mla_up_proj,mlp,moe,layernorm]"
run_case recompute_full recompute.granularity=full recompute.num_layers=1
run_case offload_half optimizer.precision_aware=true optimizer.offload_fraction=0.5 optimizer.offload_overlap=true
run_case async_gc checkpoint.save_interval=5 checkpoint.async_save=true training.manual_gc_interval=5
run_case kernels_off kernels.grouped_gemm=false kernels.permute_fusion=false kernels.router_fusion=false \
  kernels.cross_entropy_fusion=off kernels.gradient_accumulation_fusion=false
if [ "$HAVE_TE" = 1 ]; then
  run_case precision_aware_bf16 optimizer.precision_aware=true optimizer.moment_dtype=bf16
fi
skip() { echo "$1: skipped ($2)"; }
echo "== GPU-only controls, one short run each (skipped with the reason where this machine lacks what they need)"
run_case shared_expert_overlap parallel.shared_expert_overlap=true
run_case cuda_graph_local kernels.cuda_graph=local "kernels.cuda_graph_scope=[attn]"
run_case capacity_padded model.moe_capacity_factor=1.0 model.moe_pad_to_capacity=true
CC=$($PY -c "import torch; print('%d.%d' % torch.cuda.get_device_capability())" 2>/dev/null || echo 0.0)
if [ "$HAVE_TE" = 1 ]; then
  run_case cuda_graph_te kernels.cuda_graph=transformer_engine "kernels.cuda_graph_scope=[attn,moe_router]"
  run_case fp8_bf16_ends training.fp8=tensorwise "training.bf16_first_last_layers=[1,1]"
  case "$CC" in
    10.*) run_case fp8_mxfp8 training.fp8=mxfp8; run_case fp4_nvfp4 training.fp8=nvfp4 ;;
    *) skip "mxfp8/nvfp4" "compute capability $CC: Blackwell data-center GPUs only; train must refuse it:"
       run_case fp8_mxfp8_refused training.fp8=mxfp8 ;;
  esac
  NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
  if [ "$NGPU" -ge 2 ]; then  # Transformer Engine's ring attention over 2 GPUs, against the 1-GPU bf16 run above
    run_case context_parallel_2 parallel.context=2 --nproc-per-node 2
  else
    skip "context parallelism" "needs 2 GPUs (this machine has $NGPU)"
  fi
else
  for name in cuda_graph_te fp8_bf16_ends fp8_mxfp8 fp4_nvfp4 context_parallel; do
    skip "$name" "needs Transformer Engine"
  done
fi
echo "HAVE_TE=$HAVE_TE"
