"""Environment variables a GPU training job should start with, derived from its config.

Each comes with its reason; the Slurm job script exports them as defaults that `--env NAME=value`
overrides (launch/sbatch_script.py), and they follow NVIDIA's published DeepSeek-V3 recipes.
"""

from __future__ import annotations


def gpu_job_env(cfg) -> list[tuple[str, str, str]]:
    """(name, value, why) for a GPU job of `cfg`."""
    p = cfg.parallel
    connections = "32" if p.moe_a2a_overlap else "1"
    return [
        ("NCCL_DEBUG", "WARN", "NCCL errors and warnings in the rank logs"),
        ("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1", "a failed collective ends the job instead of hanging it"),
        ("CUDA_DEVICE_MAX_CONNECTIONS", connections,
         "32 lets the expert-parallel all-to-all overlap run on its own queues (parallel.moe_a2a_overlap)"
         if p.moe_a2a_overlap else
         "one hardware queue keeps megatron-core's tensor-parallel communication ahead of the GEMMs it overlaps"),
        ("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True",
         "fewer out-of-memory failures from fragmentation (MoE token counts change every step)"),
        ("NCCL_NVLS_ENABLE", "0", "NVLink SHARP buffers cost memory the recipes keep for activations"),
    ]
