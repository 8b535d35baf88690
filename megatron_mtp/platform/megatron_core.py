"""The megatron-core lines we support, and the few places where their APIs differ.

Design note. Two lines are tested: 0.16.x (the newest for Python 3.11) and 0.19.x (Python 3.12,
what current clusters and NGC containers run). Everything else is one code path. What differs, and
is answered here alone:
  - the MTP loss tracker: 0.16 keeps each depth's loss in ``tracker["values"]`` through
    ``save_loss_to_tracker``; 0.19 keeps ``loss_values`` (beside its own acceptance counts,
    ``correct_values``/``total_values``) through ``save_metrics_to_tracker``, and clears with
    ``clean_metrics_in_tracker``. Reading the old key on 0.19 gives no MTP loss at all, which is how
    a run logged ``mtp1_loss 0.0000`` while training normally.
  - the MTP layer's transformer layer: the module attribute ``transformer_layer`` became
    ``mtp_model_layer`` in 0.17. Checkpoint keys keep ``transformer_layer.`` on both lines (0.19's
    ``sharded_state_dict`` maps the new name back for GPT models), so only code that walks modules
    or the plain ``state_dict`` needs ``MTP_LAYER_ATTR``.
  - layer specs: 0.19 describes a TransformerLayer's ``mlp`` as ``functools.partial(
    MLP.as_mlp_submodule, submodules=...)`` where 0.16 had ``ModuleSpec(module=MLP, ...)``;
    ``spec_module`` names the class either way.
  - GPTModel._postprocess takes more keywords on 0.19 (``padding_mask``, ``output_processor``...):
    subclasses pass unknown ones through.
A megatron-core outside both lines is refused at start-up (``check_supported``) in one sentence,
never run on a path nobody tested.
"""

from __future__ import annotations

import functools
from importlib.metadata import PackageNotFoundError, version
from typing import Optional

from megatron_mtp.errors import UserError

TESTED_LINES = {(0, 16): "3.11", (0, 19): "3.12"}
"""(major, minor) of each tested megatron-core line -> the Python it is tested on."""


def tested_lines_text() -> str:
    return " and ".join(f"{a}.{b}.x (Python {py})" for (a, b), py in TESTED_LINES.items())


@functools.lru_cache(maxsize=None)
def installed_version() -> Optional[str]:
    try:
        return version("megatron-core")
    except PackageNotFoundError:
        return None


def major_minor(ver: str) -> tuple[int, int]:
    """(major, minor) of a version string ("2.13.0+cpu", "0.19.2", "2.1rc1"); (0, 0) for one that has none."""
    parts = ver.split("+")[0].split(".")
    try:
        return int(parts[0]), int("".join(ch for ch in parts[1] if ch.isdigit()) or 0)
    except (IndexError, ValueError):
        return (0, 0)


def line(ver: Optional[str] = None) -> tuple[int, int]:
    """(major, minor) of the installed (or given) megatron-core."""
    ver = ver if ver is not None else installed_version()
    return (0, 0) if ver is None else major_minor(ver)


def check_supported(ver: Optional[str] = None) -> None:
    """One sentence for a megatron-core outside the tested lines (or none installed)."""
    ver = ver if ver is not None else installed_version()
    if ver is None:
        raise UserError(f"megatron-core is not installed; install one of the tested lines, {tested_lines_text()} "
                        "(tools/setup_env.sh does it)")
    if line(ver) not in TESTED_LINES:
        raise UserError(f"megatron-core {ver} is installed, but megatron-mtp is tested only on {tested_lines_text()}; "
                        "install a tested line (pip install -e . picks the one for this Python)")


def is_019() -> bool:
    return line() >= (0, 17)


def background_save_options() -> dict:
    """dist_checkpointing.save's keywords for a background save. megatron-core 0.19 defaults to the writer of
    nvidia-resiliency-ext (async_strategy='nvrx'), an optional package that then fails the first save when
    missing; its built-in writer ('mcore'), the one 0.16 always uses and the AsyncCallsQueue the saver drives,
    is asked for by name."""
    import inspect

    from megatron.core import dist_checkpointing

    takes = "async_strategy" in inspect.signature(dist_checkpointing.save).parameters
    return {"async_strategy": "mcore"} if takes else {}


def transformer_config_extras(mtp) -> dict:
    """TransformerConfig fields that only 0.19 has, for ``mtp`` (config.MTPConfig); refused on 0.16 in
    one sentence (called before any process group starts, and again when the config is built)."""
    if not mtp.repeated_layer:
        return {}
    if not is_019():
        raise UserError(f"mtp.repeated_layer needs megatron-core 0.19 (mtp_use_repeated_layer), and this "
                        f"environment has megatron-core {installed_version()}; run it on Python 3.12 with "
                        "megatron-core 0.19 (tools/setup_env.sh python3.12), or drop mtp.repeated_layer")
    return {"mtp_use_repeated_layer": True}


MTP_LAYER_ATTR = "mtp_model_layer" if is_019() else "transformer_layer"
"""Attribute of a MultiTokenPredictionLayer that holds its transformer layer (module names only;
checkpoint keys say ``transformer_layer`` on both lines)."""


def spec_module(node):
    """The module class a spec node builds: ModuleSpec.module, a partial of a class's builder
    (``MLP.as_mlp_submodule``), a plain class, else None."""
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(node, ModuleSpec):
        return node.module
    if isinstance(node, functools.partial):
        owner = getattr(node.func, "__self__", None)
        return owner if isinstance(owner, type) else node.func
    return node if isinstance(node, type) else None


# --- the MTP loss tracker -------------------------------------------------------------------------

def record_mtp_loss(loss, depth_index: int, depth: int, avg_group, correct=None, total=None) -> None:
    """Add one depth's mean loss of a micro-batch to megatron-core's tracker (and, on 0.19, its
    acceptance counts: zero where the caller measures acceptance itself)."""
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    if is_019():
        import torch

        zero = torch.zeros((), device=loss.device)
        MTPLossLoggingHelper.save_metrics_to_tracker(
            loss, zero if correct is None else correct, zero if total is None else total,
            depth_index, depth, avg_group=avg_group)
    else:
        MTPLossLoggingHelper.save_loss_to_tracker(loss, depth_index, depth, avg_group=avg_group)


def _tracker() -> dict:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    return MTPLossLoggingHelper.tracker


def mtp_loss_values():
    """This rank's per-depth MTP losses summed over the step's micro-batches ([D] tensor), or None."""
    return _tracker().get("loss_values" if is_019() else "values")


def mtp_acceptance_counts():
    """0.19's own per-depth (correct, total) counts of the step, or None (0.16, or not tracked)."""
    tracker = _tracker()
    if not is_019() or "correct_values" not in tracker:
        return None
    return tracker["correct_values"], tracker["total_values"]


def clear_mtp_tracker() -> None:
    from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

    if mtp_loss_values() is None:
        return
    if is_019():
        MTPLossLoggingHelper.clean_metrics_in_tracker()
    else:
        MTPLossLoggingHelper.clean_loss_in_tracker()


# --- the MoE per-layer metrics tracker ------------------------------------------------------------

def moe_layer_values(name_part: str) -> list:
    """Per-layer value tensors of megatron-core's MoE metrics whose name contains name_part (0.16: the
    layer-wise logging dict; 0.19: MoEMetricsTracker, whose dict view is rebuilt at every call)."""
    if is_019():
        from megatron.core.transformer.moe.moe_logging import get_moe_metrics_tracker

        return [entry.values for name, entry in get_moe_metrics_tracker().metrics.items() if name_part in name]
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    return [entry["values"] for name, entry in get_moe_layer_wise_logging_tracker().items() if name_part in name]


def reset_moe_tracker() -> None:
    """Forget every MoE metric entry (a process that runs several models in turn: their layer counts
    differ). clear_aux_losses_tracker only zeroes the values."""
    if is_019():
        from megatron.core.transformer.moe import moe_logging

        moe_logging._MOE_METRICS_TRACKER = None
    else:
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        get_moe_layer_wise_logging_tracker().clear()


# --- checkpoint format ----------------------------------------------------------------------------

def write_legacy_common(ckpt_dir) -> None:
    """0.19 keeps a checkpoint's non-tensor state as one object inside the torch_dist shards, where
    0.16 reads it from ``common.pt`` (and finds nothing else). Writing the same state to common.pt
    after a 0.19 save keeps every checkpoint readable by both lines; 0.19 itself prefers common.pt
    when present (its loader's legacy branch), so both lines load the same dict. No-op on 0.16."""
    import os

    path = os.path.join(str(ckpt_dir), "common.pt")
    if not is_019() or os.path.exists(path):
        return
    import torch
    from megatron.core.dist_checkpointing.serialization import load_common_state_dict

    common = load_common_state_dict(str(ckpt_dir))
    tmp = path + ".tmp"
    torch.save(common, tmp)
    os.replace(tmp, path)


# --- optimizer state ------------------------------------------------------------------------------

SCHEDULE_KEYS = ("max_lr", "min_lr", "start_wd", "end_wd")
"""Per-group schedule values that 0.19 also uses to pair a saved parameter group with a live one."""


def align_saved_param_groups(saved, live_groups: list) -> None:
    """0.19 pairs each saved optimizer parameter group with a live one by a tuple that includes the
    group's max_lr/min_lr (and weight-decay ends), so a resume with another optimizer.lr (which the
    resume rules allow: the schedule is the new config's) finds no pair and raises KeyError. Give each
    saved group the live values of the group it pairs with on the other keys; 0.16 pairs without
    them, and the live values are what both lines then train with. No-op on 0.16."""
    if not is_019():
        return
    from megatron.core.optimizer.optimizer import param_group_identifier_keys

    others = [k for k in param_group_identifier_keys if k not in SCHEDULE_KEYS]

    def ident(group):
        return tuple(group.get(k, group.get(f"pre_{k}")) for k in others)

    live = {}
    for group in live_groups:
        live.setdefault(ident(group), group)

    def walk(node):
        if isinstance(node, dict):
            if isinstance(node.get("param_groups"), list):
                for group in node["param_groups"]:
                    match = live.get(ident(group))
                    if match is not None:
                        group.update({k: match[k] for k in SCHEDULE_KEYS if k in match})
            for value in node.values():
                walk(value)
        elif isinstance(node, (list, tuple)):
            for value in node:
                walk(value)

    walk(saved)


def require_dsa(title: str) -> None:
    """DeepSeek Sparse Attention is built from megatron-core 0.19's DSA modules
    (transformer/experimental_attention_variant/); 0.16 has none: one sentence there."""
    if not is_019():
        raise UserError(f"{title} (DeepSeek Sparse Attention) needs megatron-core 0.19, whose DSA modules build it, "
                        f"and this environment has megatron-core {installed_version()}; run it on Python 3.12 with "
                        "megatron-core 0.19 (tools/setup_env.sh python3.12)")


# --- the DSA indexer loss tracker (0.19) ------------------------------------------------------------

def dsa_indexer_loss_values(config, mtp: MTPIndexerLoss | None = None):
    """This rank's per-layer DSA indexer KL losses of the step, summed over its micro-batches and before
    ``config.dsa_indexer_loss_coeff``: the decoder layers', then the MTP layers' that ``mtp`` took out of the
    tracker ([num_layers + depth] tensor), or None where none was tracked (0.16, no DSA, or a coefficient of
    0: the loss is then not computed)."""
    if not is_019() or not getattr(config, "dsa_indexer_loss_coeff", None):
        return None
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

    values = DSAIndexerLossLoggingHelper.tracker.get("values")
    if values is None:
        return None
    if mtp is not None:
        import torch

        values = torch.cat([values, mtp.values.to(values.device, values.dtype)])
    return values / config.dsa_indexer_loss_coeff


class MTPIndexerLoss:
    """The MTP layers' DSA indexer losses, apart from the decoder's. megatron-core's tracker is one [num_layers]
    tensor indexed by the attention's layer number, and the MTP layers number theirs from 1, so MTP depth k's
    loss would add to decoder layer k's entry. A pre-hook and a hook on each MTP layer's ``DSAttention`` move
    what its forward added out of that entry into ``values`` (one per depth; megatron-core adds only in a
    training forward with grad enabled, and only in a layer with its own indexer)."""

    def __init__(self, depth: int):
        import torch

        self.values = torch.zeros(depth, dtype=torch.float64)
        self._before: dict = {}

    def attach(self, model_chunks: list) -> int:
        """Hooks on the MTP layers' DSAttention of this rank's chunks; how many were hooked."""
        from megatron.core.transformer.experimental_attention_variant.dsa import DSAttention

        hooked = 0
        for chunk in model_chunks:
            for name, module in chunk.named_modules():
                if isinstance(module, DSAttention) and "mtp.layers." in name:
                    depth = int(name.split("mtp.layers.")[1].split(".")[0])
                    module.register_forward_pre_hook(self._pre_hook(depth, module.layer_number))
                    module.register_forward_hook(self._hook(depth, module.layer_number))
                    hooked += 1
        return hooked

    @staticmethod
    def _tracked():
        from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

        return DSAIndexerLossLoggingHelper.tracker.get("values")

    def _pre_hook(self, depth: int, number: int):
        def hook(module, args):
            values = self._tracked()
            self._before[depth] = None if values is None else values[number - 1].detach().clone()
        return hook

    def _hook(self, depth: int, number: int):
        def hook(module, args, output):
            values, before = self._tracked(), self._before.pop(depth, None)
            if values is None:
                return
            import torch

            with torch.no_grad():
                entry = values[number - 1].clone()
                values[number - 1] = 0.0 if before is None else before
                added = entry - values[number - 1]
                if self.values.device != added.device:
                    self.values = self.values.to(added.device)
                self.values[depth] += added.double()
        return hook

    def clear(self) -> None:
        self.values.zero_()


def mtp_indexer_loss(model_chunks: list, depth: int) -> MTPIndexerLoss | None:
    """The MTP layers' indexer losses kept apart (MTPIndexerLoss), hooked on this rank's chunks; None where
    no MTP layer of this rank has DSA attention (0.16, no DSA, no MTP, or another stage's layers)."""
    if not is_019() or depth < 1:
        return None
    separate = MTPIndexerLoss(depth)
    return separate if separate.attach(model_chunks) else None


def clear_dsa_indexer_tracker(mtp: MTPIndexerLoss | None = None) -> None:
    if mtp is not None:
        mtp.clear()
    if is_019():
        from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerLossLoggingHelper

        DSAIndexerLossLoggingHelper.clean_loss_in_tracker()
