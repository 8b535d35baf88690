"""What ``plan`` counts of an EAGLE-3 drafter: its parameters (registered after GPTModel's own modules, on the loss
stage), its K steps' saved activations and its sentence. The steps' logits are counted by the shared output-and-loss
inventory at the target's vocabulary (an over-count with a smaller draft vocabulary)."""

from __future__ import annotations

from megatron_mtp.models.saved_activations import FP32, Saved
from megatron_mtp.mtp_styles.eagle3.shape import PREFIX, drafter_shape
from megatron_mtp.plan.params import Param


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list[Param]:
    """The drafter's parameters in registration order (one tensor-parallel rank: the style runs at TP 1)."""
    if not stage.mtp_layers:
        return []
    s = drafter_shape(cfg)
    h, q, kv = s.hidden, s.heads * s.head_dim, s.groups * s.head_dim
    out = [Param(f"{PREFIX}fc.weight", len(s.aux_layers) * h * h)]
    for i in range(s.num_layers):
        p, width = f"{PREFIX}layers.{i}.", 2 * h if i == 0 else h
        out += [Param(f"{p}input_layernorm.weight", h)] + ([Param(f"{p}hidden_norm.weight", h)] if i == 0 else [])
        out += [Param(f"{p}self_attention.linear_{n}.weight", width * rows, linear=True)
                for n, rows in (("q", q), ("k", kv), ("v", kv))]
        out += [Param(f"{p}self_attention.linear_proj.weight", q * h, linear=True),
                Param(f"{p}pre_mlp_layernorm.weight", h),
                Param(f"{p}mlp.linear_fc1.weight", h * 2 * s.ffn, linear=True),
                Param(f"{p}mlp.linear_fc2.weight", s.ffn * h, linear=True)]
    return out + [Param(f"{PREFIX}final_layernorm.weight", h),
                  Param(f"{PREFIX}lm_head.weight", h * (s.draft_vocab or padded_vocab))]


def saved(cfg, stage, d, k, mods, grouped_gemm: bool, head_grad_bytes: float) -> list:
    """Per step and layer: the norms' and projections' inputs, q/k/v, the attention's fp32 probabilities over the
    context and the earlier steps (layer.py computes them in full), the SwiGLU's inputs; per step the final norm's
    and the head's inputs; the aux hidden states entering fc once."""
    if not stage.mtp_layers:
        return []
    s, a, n = drafter_shape(cfg), d.act_bytes, d.tokens
    steps = cfg.mtp.num_layers
    out = Saved()
    out.add("fc.input", len(s.aux_layers) * s.hidden * n * a)
    qkv = (s.heads + 2 * s.groups) * s.head_dim
    for step in range(steps):
        for i in range(s.num_layers):
            width = 2 * s.hidden if i == 0 else s.hidden
            out.add("layers.norm_inputs", (width + s.hidden) * n * a)
            out.add("layers.qkv_input", width * n * a)
            out.add("layers.qkv", qkv * n * a)
            out.add("layers.attention_probs", s.heads * n * (d.seq + step) * FP32)
            out.add("layers.proj_input", s.heads * s.head_dim * n * a)
            out.add("layers.mlp", (s.hidden + 3 * s.ffn) * n * a)
        out.add("final_norm.input", s.hidden * n * a)
        out.add("lm_head.input", s.hidden * n * a)
    return [(PREFIX, out)]


def assumption(cfg):
    s = drafter_shape(cfg)
    vocab = f"a draft vocabulary of {s.draft_vocab} tokens" if s.draft_vocab else "the whole vocabulary"
    return (f"MTP: an EAGLE-3 drafter ({s.num_layers} layer(s) of {s.heads} heads, fc over the target's layers "
            f"{list(s.aux_layers)}, {vocab}) drafting {cfg.mtp.num_layers} steps on the loss stage of the frozen "
            "target; its logits counted at the target's vocabulary")


def drafter_tp(cfg, d) -> float:
    """No tensor-parallel traffic: the style runs at parallel.tensor=1."""
    return 0.0
