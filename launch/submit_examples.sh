#!/bin/bash
# Typical `megatron-mtp submit` command lines. Add --dry-run to any of them to see the job script
# without submitting. Overrides (key.path=value) go right after the config file.
set -euo pipefail
CONFIG=${CONFIG:-configs/tiny_cpu.yaml}

case "${1:-help}" in
  gpu)  # 4 nodes x 8 GPUs inside an NGC container (pyxis), 4-hour slots, requeue until done
    megatron-mtp submit "$CONFIG" parallel.expert=8 training.global_batch_size=256 \
      --nodes 4 --gpus-per-node 8 --partition batch --account my_account --time 4:00:00 \
      --container-image nvcr.io/nvidia/pytorch:25.09-py3 --container-mounts /lustre:/lustre \
      --env NCCL_IB_HCA=mlx5 --run-dir /lustre/${USER:-me}/runs/mtp-671b-proxy "${@:2}" ;;
  chain)  # the same, as a chain of 6 dependent jobs instead of self-requeue
    megatron-mtp submit "$CONFIG" training.global_batch_size=256 \
      --nodes 4 --gpus-per-node 8 --time 4:00:00 --resume chain --chain 6 "${@:2}" ;;
  cpu)  # a CPU/gloo test cluster: 2 nodes x 2 processes
    megatron-mtp submit "$CONFIG" training.max_steps=20 training.global_batch_size=32 \
      --nodes 2 --cpu --tasks-per-node 2 --time 30 "${@:2}" ;;
  *)
    echo "usage: $0 gpu|chain|cpu [more submit options, e.g. --dry-run]" >&2; exit 2 ;;
esac
