"""The global batch size of each step: fixed, or ramped up (training.rampup_batch_size).

Design note. The ramp is megatron-core's own RampupBatchsizeNumMicroBatchesCalculator (the
`--rampup-batch-size START INCREMENT SAMPLES` of Megatron-LM), kept as this run's object rather than
megatron-core's process-wide one: the batch grows from START by INCREMENT over the first SAMPLES
samples, in equal steps of consumed samples, to training.global_batch_size. The step's size is a
function of the consumed samples alone, which the checkpoint holds, so a resume in the middle of the
ramp continues it exactly. What follows the consumed samples or tokens follows the ramp by itself:
the data order (each micro-batch advances micro batch × data parallel samples), the MTP weight λ
(by consumed tokens) and the token counts. The learning-rate schedule stays in optimizer steps (the
config's units: schedule.warmup_steps, training.max_steps).
"""

from __future__ import annotations


class BatchRamp:
    def __init__(self, cfg, dp: int, rank: int):
        t = cfg.training
        self.per_micro = t.micro_batch_size * dp
        self.fixed = t.global_batch_size
        self.calculator = None
        if t.rampup_batch_size:
            from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

            start, increment, samples = t.rampup_batch_size
            self.calculator = RampupBatchsizeNumMicroBatchesCalculator(
                t.global_batch_size, t.micro_batch_size, dp, False, rank, start, increment, samples)

    def global_batch(self, consumed_samples: int) -> int:
        """The global batch size of the step that starts after `consumed_samples` samples."""
        if self.calculator is None:
            return self.fixed
        self.calculator.update(consumed_samples, consistency_check=True)
        return self.calculator.get_current_global_batch_size()

    def micro_batches(self, consumed_samples: int) -> int:
        return self.global_batch(consumed_samples) // self.per_micro
