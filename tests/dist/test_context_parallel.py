"""Context parallelism around attention on CPU: megatron-core's MTP roll over real gloo process groups
(attention itself needs Transformer Engine: training with parallel.context > 1 is refused here)."""

from __future__ import annotations

import pytest

pytestmark = [pytest.mark.dist, pytest.mark.mcore]


@pytest.mark.parametrize("cp", [2, 4])
def test_mtp_roll_over_context_parallel_ranks_equals_the_whole_sequence_rolled(cp, script):
    proc = script("cp_roll.py", nproc=cp)
    assert proc.returncode == 0 and "CPROLL OK" in proc.stdout, proc.stderr[-4000:]
