"""The host-side Adam implementations the platform layer can choose compute the same update."""

from __future__ import annotations

import pytest
import torch

from megatron_mtp.platform.optimizers import FusedCPUAdamW

ARGS = dict(lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def _run(make, steps=5):
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(300, 70)) for _ in range(3)]
    opt = make(params)
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()
    return params


def _max_rel(a, b):
    return max(float((x - y).abs().max() / y.abs().max()) for x, y in zip(a, b))


def test_fused_torch_adamw_equals_the_default_one():
    reference = _run(lambda p: torch.optim.AdamW(p, **ARGS, foreach=True))
    assert _max_rel(_run(lambda p: FusedCPUAdamW(p, **ARGS)), reference) < 1e-6


def test_deepspeed_cpu_adam_matches_torch_within_1e_5():
    pytest.importorskip("deepspeed", reason="the optional deepspeed extra is not installed")
    from megatron_mtp.platform.deepspeed_adam import DeepSpeedCPUAdamW

    reference = _run(lambda p: torch.optim.AdamW(p, **ARGS))
    deepspeed = _run(lambda p: DeepSpeedCPUAdamW(p, **ARGS, fused=True))  # megatron-core passes fused=True
    assert _max_rel(deepspeed, reference) < 1e-5
    opt = DeepSpeedCPUAdamW([torch.nn.Parameter(torch.ones(3))], **ARGS)
    opt.param_groups[0]["params"][0].grad = torch.ones(3)
    opt.step()
    assert torch.is_tensor(next(iter(opt.state.values()))["step"])  # what megatron-core's saver reads
