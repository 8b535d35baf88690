"""What ``plan`` counts of a separate drafter: its parameters (its family's table of them, registered after
GPTModel's own modules), its K steps' saved activations (``assistant``), its tensor-parallel
traffic on the loss stage (plan/comm.py ``assistant_tp``) and its sentence."""

from __future__ import annotations

import math
from dataclasses import replace

from megatron_mtp.config.root import Config
from megatron_mtp.models.family import get_family
from megatron_mtp.models.saved_activations import Dims, Kernels, Saved, norm
from megatron_mtp.models.sizes import assistant_weights
from megatron_mtp.plan import activations as act
from megatron_mtp.plan.comm import assistant_tp as drafter_tp  # noqa: F401  (its K steps' TP traffic)
from megatron_mtp.plan.params import Param
from megatron_mtp.plan.speculative import assistant_step_bytes as draft_step_bytes  # noqa: F401  (one draft step)


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list[Param]:
    """Parameters of the drafter on the stage that holds it: its family's table of them."""
    if not stage.mtp_layers:
        return []
    tensors = get_family(cfg.model.family).style_part(cfg.mtp.style).tensors(cfg, padded_vocab)
    return [Param(t.mcore, math.prod(t.shape) // (sizes.tp if t.tp else 1),
                  linear=".linear_" in t.mcore and t.mcore.endswith(".weight")) for t in tensors if not t.buffer]


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list[tuple[str, Saved]]:
    """Its K steps on the loss stage."""
    return [("mtp_assistant.", assistant(cfg, d, k, cfg.mtp.num_layers))] if stage.mtp_layers else []


def assistant(cfg: Config, d: Dims, k: Kernels, steps: int) -> Saved:
    """A separate drafter's K steps on the loss stage (mtp.style assistant, models/gemma4/assistant/): per step
    its projections' inputs, its sandwich layers at its own width with query-only attention (no key/value
    norms; the target's stored keys and values, counted once, are what the query attends to), its final norm
    and its output table's input; the steps' logits are output_and_loss's. Checked against real ranks
    (tests/dist/test_plan_exact.py, gemma4_assistant_tp2_ep2: 0.94 of measured)."""
    family, out = get_family(cfg.model.family), Saved()
    parts = family.style_part(cfg.mtp.style)  # its separate drafter
    drafter = replace(cfg, model=parts.model(cfg))
    a, n = d.act_bytes, d.local
    for _ in range(steps):
        out.add("pre_projection.input", 2 * d.hidden * n * a)
        for i in range(drafter.model.num_layers):
            layer = act.layer_dims(drafter, act.dims_of(drafter, d.vocab * d.tp, seq=d.seq, batch=d.batch), i)
            saved = family.saved_layer(layer, k, frozenset(), False, False)  # a sandwich layer without experts
            saved.drop("k_norm", "v_norm", "qkv.k", "qkv.v", "attn.k_copy", "attn.v_copy")
            for name, nbytes in saved.items.items():
                out.add(f"layers.{name}", nbytes)
        norm(out, "final_norm", drafter.model.hidden_size, n, d, k)
        out.add("post_projection.input", drafter.model.hidden_size * n * a)
        out.add("output_layer.input", drafter.model.hidden_size * d.tokens * a)
    stored = {kind: i for kind, i in parts.stored(cfg).items()}
    for kind, index in stored.items():  # the target's keys and values the steps' attention keeps for backward
        shape = act.layer_dims(cfg, d, index)
        out.add(f"stored_kv.{kind}", (1 if shape.shares_kv else 2) * d.tokens * shape.kv_heads * shape.qk_dim * a)
    return out


def step_flops(family, cfg: Config, padded_vocab: int) -> float:
    """Forward FLOPs per token of one of its steps: all its weights and its attention over the stored keys."""
    weights, drafter = assistant_weights(family, cfg, padded_vocab)
    return 2 * weights + drafter.model.num_layers * family.decode_attention_flops(drafter, cfg.training.seq_length // 2)


def assumption(cfg):
    a = cfg.mtp.assistant
    return (f"MTP: an assistant ({a.num_layers} layers of width {a.hidden_size}, its own output table) drafting "
            f"{cfg.mtp.num_layers} steps on the loss stage over the frozen target's stored keys/values "
            "(mtp_styles/assistant/plan.py assistant)")
