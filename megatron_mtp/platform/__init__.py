"""The one place that knows CPU vs GPU, Transformer Engine vs local specs, apex or not.

Everything else asks `current()` (after `setup()`) and never checks `torch.cuda` itself.
"""

from megatron_mtp.platform.detect import Platform, all_reduce_sum, current, setup

__all__ = ["Platform", "all_reduce_sum", "current", "setup"]
