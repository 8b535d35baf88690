"""The global batch size of each step: fixed, or ramped up (training.rampup_batch_size).

Design note. The ramp is Megatron-LM's `--rampup-batch-size START INCREMENT SAMPLES`, the rule of
megatron-core 0.16's RampupBatchsizeNumMicroBatchesCalculator: the batch grows from START by
INCREMENT in equal steps of consumed samples (SAMPLES / the number of increments) and is the full
global batch once SAMPLES samples are consumed. megatron-core 0.19 replaced that calculator by a
step schedule of its own, so the rule is computed here for both lines and checked equal to 0.16's
calculator (tests/unit/test_batch_ramp.py). The step's size is a function of the consumed samples
alone, which the checkpoint holds, so a resume in the middle of the ramp continues it exactly. What
follows the consumed samples or tokens follows the ramp by itself: the data order (each micro-batch
advances micro batch × data parallel samples), the MTP weight λ (by consumed tokens) and the token
counts. The learning-rate schedule stays in optimizer steps (the config's units:
schedule.warmup_steps, training.max_steps).
"""

from __future__ import annotations


def ramped_global_batch(consumed_samples: int, start: int, increment: int, samples: int, full: int) -> int:
    """The global batch after `consumed_samples` on the ramp START -> `full` by INCREMENT over SAMPLES."""
    increments = (full - start) // increment
    if consumed_samples > samples or increments == 0 or samples == 0:  # 0.16's calculator divides by 0 there
        return full
    return start + int(consumed_samples / (samples / increments)) * increment


class BatchRamp:
    def __init__(self, cfg, dp: int):
        t = cfg.training
        self.per_micro = t.micro_batch_size * dp
        self.full = t.global_batch_size
        self.ramp = tuple(t.rampup_batch_size) if t.rampup_batch_size else None

    def global_batch(self, consumed_samples: int) -> int:
        """The global batch size of the step that starts after `consumed_samples` samples."""
        if self.ramp is None:
            return self.full
        return ramped_global_batch(consumed_samples, *self.ramp, self.full)

    def micro_batches(self, consumed_samples: int) -> int:
        return self.global_batch(consumed_samples) // self.per_micro
