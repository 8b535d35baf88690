"""Load the parallel-format (`dp_reshardable`) distributed-optimizer state into fp32 parameters.

megatron-core copies each loaded shard into the optimizer's main parameter with an in-place
`copy_` and, for this one format, outside `torch.no_grad()` (its other loaders are decorated). With
fp32 training the main parameter is the model parameter's own view, a leaf that requires grad, so
the copy raises "a view of a leaf Variable that requires grad is being used in an in-place
operation". We run megatron-core's loader of that format under no_grad, as its siblings are; the
values it copies are unchanged. Applied on every platform (it is not about TE), idempotent.
"""

from __future__ import annotations


def apply() -> None:
    import torch
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    original = cls.load_parameter_state_from_dp_reshardable
    if getattr(original, "_megatron_mtp_patched", False):
        return

    def load_parameter_state_from_dp_reshardable(self, state_dict):
        with torch.no_grad():
            return original(self, state_dict)

    load_parameter_state_from_dp_reshardable._megatron_mtp_patched = True
    cls.load_parameter_state_from_dp_reshardable = load_parameter_state_from_dp_reshardable
