"""Correct megatron-core's view of Transformer Engine when TE is absent (CPU, or GPU without TE).

megatron-core's TE extension imports with stand-ins even when TE is missing, so some modules
believe TE is present: multi_latent_attention then calls isinstance() against a mock class, the
MoE router's gating GEMM reads a name that is never bound, recompute's CheckpointWithoutOutput
enters TE's FP8 state, and TE version checks compare None with a version.
We state the truth in those modules. Local (non-TE) specs are built in platform/local_modules.py.
"""

from __future__ import annotations

import torch

_APPLIED = False


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    from megatron.core.transformer import multi_latent_attention

    multi_latent_attention.HAVE_TE = False

    # The router's gating GEMM references `te_general_gemm`, which is only bound when TE imports.
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None

    _patch_checkpoint_without_output()
    _patch_te_version_checks()
    _patch_torch_adam_state_load()
    _APPLIED = True


def _patch_checkpoint_without_output() -> None:
    """`CheckpointWithoutOutput(fp8=False)` sets `self.fp8 = fp8 is not None` (True), so its forward
    calls TE's FP8GlobalStateManager, a name bound only when TE imports: recomputing 'layernorm' or
    'moe_act' raises NameError without TE. Without TE there is no FP8 state to track."""
    from megatron.core.tensor_parallel import random as mrandom

    cls = mrandom.CheckpointWithoutOutput
    if getattr(cls.__init__, "_megatron_mtp_patched", False) or getattr(mrandom, "HAVE_TE", False):
        return
    original = cls.__init__

    def __init__(self, fp8=False):
        original(self, fp8)
        self.fp8 = False

    __init__._megatron_mtp_patched = True
    cls.__init__ = __init__


def _patch_te_version_checks() -> None:
    """`is_te_min_version()` compares `None >= Version` and raises TypeError when TE is absent (an
    OptimizerConfig with the precision-aware optimizer, FP8 settings): without TE no minimum version
    is met. Replaced in megatron.core.utils and in every megatron.core module that imported it."""
    import sys

    from megatron.core import utils

    if utils.get_te_version() is not None:
        return
    original = getattr(utils, "_megatron_mtp_original_is_te_min_version", utils.is_te_min_version)

    def is_te_min_version(version, check_equality=True):
        return False

    utils._megatron_mtp_original_is_te_min_version = original
    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.core") and getattr(module, "is_te_min_version", None) is original:
            module.is_te_min_version = is_te_min_version


def _patch_torch_adam_state_load() -> None:
    """Resharding load of torch-Adam state in the distributed optimizer (two fixes).

    Without TE/apex fused Adam, megatron-core keeps torch Adam's per-parameter 'step' in the live
    state but leaves it out of `fully_reshardable` checkpoints (it is restored from the param
    groups); copying the loaded tensors then looks up 'step' and fails. The `dp_reshardable` format
    hands back, as 'step', the tensor the live state held when the state dict to load was built (a
    non-persistent object: the fresh optimizer's 1), which would overwrite the restored count and
    change Adam's bias correction from the first resumed step on. In both, we carry the live 'step'
    over (it already holds the value restored from the param groups).
    """
    from megatron.core.optimizer import distrib_optimizer

    cls = distrib_optimizer.DistributedOptimizer
    original = cls._set_main_param_and_optimizer_states
    if getattr(original, "_megatron_mtp_patched", False):
        return

    def set_states(self, model_param, tensors):
        group_index, group_order = self.model_param_group_index_map[model_param]
        main_param = self.optimizer.param_groups[group_index]["params"][group_order]
        live = self.optimizer.state.get(main_param, {})
        if "step" in live:  # restored from the param groups just before: it wins over a loaded 'step'
            tensors = {**tensors, "step": live["step"]}
        return original(self, model_param, tensors)

    set_states._megatron_mtp_patched = True
    cls._set_main_param_and_optimizer_states = set_states

    # megatron-core's load_state_dict assigns ONE 'step' tensor to every parameter's state; torch
    # Adam then increments it in place once per parameter per step, corrupting bias correction
    # after a resume. Give each parameter its own copy.
    original_load = cls.load_state_dict

    def load_state_dict(self, state_dict):
        result = original_load(self, state_dict)
        steps = [g.get("step") for g in state_dict.get("optimizer", {}).get("param_groups", [])]
        if steps and steps[0] is not None:
            self._megatron_mtp_steps = int(steps[0])
        for per_param in self.optimizer.state.values():
            step = per_param.get("step")
            if torch.is_tensor(step):
                per_param["step"] = step.clone()
        return result

    cls.load_state_dict = load_state_dict

    # A rank whose sub-optimizer holds no parameter state (e.g. the expert optimizer on a pipeline
    # stage without MoE layers) has no per-parameter 'step' to read, and megatron-core asserts on
    # it. We count successful steps ourselves and record that count instead.
    original_state_dict = cls.state_dict
    original_step = cls.step_with_ready_grads

    def step_with_ready_grads(self):
        ok = original_step(self)
        if ok:
            self._megatron_mtp_steps = getattr(self, "_megatron_mtp_steps", 0) + 1
        return ok

    cls.step_with_ready_grads = step_with_ready_grads

    def state_dict(self):
        if len(self.optimizer.state) > 0:
            return original_state_dict(self)
        inner = self.optimizer.state_dict()
        groups = [{k: v for k, v in g.items() if k != "params"} | {"step": getattr(self, "_megatron_mtp_steps", 0)}
                  for g in inner["param_groups"]]
        result = {"optimizer": {k: v for k, v in inner.items() if k != "state"} | {"param_groups": groups}}
        if self.grad_scaler:
            result["grad_scaler"] = self.grad_scaler.state_dict()
        return result

    cls.state_dict = state_dict
