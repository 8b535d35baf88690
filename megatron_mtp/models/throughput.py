"""Model FLOPs and MFU: the one definition `plan --mfu` and the trainer's logged TFLOP/s and MFU share.

Definition (Megatron-LM's "model FLOPs"): per token, 3 × the forward FLOPs of the matmuls and of the
causal attention scores (QK^T and AV over half the sequence on average) of the main model, its MTP
modules and the output head (an MTP-only step, mtp.freeze_base: the main model's forward and the MTP
modules' forward and backward, models/sizes.py). Recomputation is not counted (it is not model work),
and neither are norms, rotary embeddings or routers. torchtitan counts the same matmuls and attention
scores, over the whole sequence (12 · layers · heads · head_dim · seq, twice Megatron's causal half),
so its MFU reads higher for the same run. MFU = model FLOP/s per GPU / the GPU's dense peak for the
run's precision (bf16, or FP8 with training.fp8; the `plan` GPU table). On CPU only TFLOP/s is logged:
there is no peak to hold it against.
"""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.platform.gpus import Gpu, gpu_of_device

__all__ = ["gpu_of_device", "model_flops_per_token", "peak_tflops"]


def model_flops_per_token(cfg: Config, padded_vocab: int) -> float:
    """Model FLOPs of one trained token of this run (module note)."""
    from megatron_mtp.models.family import get_family
    from megatron_mtp.models.sizes import mtp_only_flops_per_token

    family = get_family(cfg.model.family)
    if cfg.mtp.freeze_base and cfg.mtp.num_layers:
        return mtp_only_flops_per_token(family, cfg, padded_vocab, cfg.mtp.num_layers)
    return family.training_flops_per_token(cfg, padded_vocab, cfg.mtp.num_layers)


def peak_tflops(gpu: Gpu, cfg: Config) -> float:
    """The GPU's dense peak TFLOP/s for the run's precision (0: unknown)."""
    return gpu.fp8_tflops if cfg.training.fp8 else gpu.bf16_tflops

