"""The batch-size ramp (training/batch_ramp.py) is megatron-core 0.16's RampupBatchsizeNumMicroBatchesCalculator
rule (Megatron-LM's --rampup-batch-size), computed on both megatron-core lines."""

from __future__ import annotations

import pytest

from megatron_mtp.platform import megatron_core
from megatron_mtp.training.batch_ramp import ramped_global_batch


@pytest.mark.skipif(megatron_core.is_019(), reason="megatron-core 0.19 replaced the ramp-up calculator")
@pytest.mark.parametrize("start, increment, samples, full", [(2, 2, 12, 8), (3072, 96, 114_501_953, 15_360),
                                                             (16, 16, 1000, 64)])
def test_the_ramp_is_megatron_cores_ramp_up_calculator(start, increment, samples, full):
    from megatron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    calc = RampupBatchsizeNumMicroBatchesCalculator(full, 1, 1, False, 1, start, increment, samples)
    points = sorted({0, 1, samples // 3, samples // 2, samples - 1, samples, samples + 1, 2 * samples + 7}
                    | set(range(0, max(samples, 1), max(samples // 97, 1))))
    for consumed in points:
        if consumed < 0:
            continue
        calc.update(consumed, consistency_check=False)
        assert ramped_global_batch(consumed, start, increment, samples, full) == \
            calc.get_current_global_batch_size(), consumed


def test_the_ramp_grows_in_equal_steps_of_samples_to_the_full_batch():
    sizes = [ramped_global_batch(c, 2, 2, 12, 8) for c in range(0, 16)]
    assert sizes == [2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6, 8, 8, 8, 8]
    assert ramped_global_batch(10**9, 3072, 96, 114_501_953, 15_360) == 15_360
    assert ramped_global_batch(0, 64, 64, 1000, 64) == 64  # nothing to ramp
    assert ramped_global_batch(0, 32, 32, 0, 64) == 64  # a ramp over no samples
