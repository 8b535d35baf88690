"""DeepSpeed's CPUAdam as the host-side Adam of megatron-core's offload optimizer (the optional
`deepspeed` extra; imported only when optimizer.cpu_optimizer=deepspeed)."""

from __future__ import annotations

import torch
from deepspeed.ops.adam import DeepSpeedCPUAdam


class DeepSpeedCPUAdamW(DeepSpeedCPUAdam):
    """CPUAdam in AdamW mode, taking the keyword arguments megatron-core passes its CPU Adam.

    Between steps each parameter's 'step' is a tensor, as in torch's Adam: megatron-core's
    distributed optimizer reads it with .item() when it saves; DeepSpeed's kernel wants an int.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, bias_correction=True,
                 fused=None, **_):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                         bias_correction=bias_correction, adamw_mode=True)

    def step(self, closure=None):
        for state in self.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = int(state["step"].item())
        result = super().step(closure)
        for state in self.state.values():
            if isinstance(state.get("step"), int):
                state["step"] = torch.tensor(float(state["step"]))
        return result
