"""What ``plan`` counts of an EAGLE-3 drafter: its parameters (registered after GPTModel's own modules, on the loss
stage), a step's FLOPs, its K steps' saved activations, the bytes a decoding draft step reads (``plan
--speculative``) and its sentence. The steps' logits are counted by the shared
output-and-loss inventory at the target's vocabulary (an over-count with a smaller draft vocabulary)."""

from __future__ import annotations

import math

from megatron_mtp.models.saved_activations import FP32, Saved
from megatron_mtp.mtp_styles.eagle3.shape import BUFFERS, PREFIX, drafter_shape, tensor_shapes
from megatron_mtp.plan.params import Param


def params(cfg, sizes, stage, padded_vocab: int, te: bool) -> list[Param]:
    """The drafter's parameters in registration order (one tensor-parallel rank: the style runs at TP 1)."""
    if not stage.mtp_layers:
        return []
    return [Param(key, math.prod(shape), linear=".linear_" in key)
            for key, shape in tensor_shapes(cfg, padded_vocab).items() if key not in BUFFERS]


def step_flops(family, cfg, padded_vocab: int) -> float:
    """Forward FLOPs per token of one draft step (the style's ``drafter_flops``): all its weights, ``fc`` shared
    out over the mtp.num_layers steps (it runs once), and each layer's attention over the context (on average half
    the sequence, causal) and the earlier steps."""
    s, steps = drafter_shape(cfg), max(cfg.mtp.num_layers, 1)
    shapes = tensor_shapes(cfg, padded_vocab)
    fc = math.prod(shapes.pop(f"{PREFIX}fc.weight"))
    weights = sum(math.prod(shape) for key, shape in shapes.items() if key not in BUFFERS)
    keys = cfg.training.seq_length / 2 + (steps - 1) / 2
    return 2 * weights + 2 * fc / steps + s.num_layers * 2 * 2 * s.heads * s.head_dim * keys


def draft_step_bytes(cfg, padded_vocab: int, batch: int, serve):
    """Bytes one GPU reads in one draft step of ``batch`` sequences (plan/speculative.py): its layers, final norm and
    head over the draft vocabulary, ``fc`` shared out over the mtp.num_layers steps of a round (the round's first
    step runs it once, over the positions accepted since the last), its own keys/values over the context (one entry
    per position, as the target's), no expert; split over the serving layout's TP ranks as the target's dense
    weights. The target's embedding rows it looks up are not counted (one row per sequence)."""
    from megatron_mtp.plan.speculative import ForwardBytes

    s, steps = drafter_shape(cfg), max(cfg.mtp.num_layers, 1)
    shapes = tensor_shapes(cfg, padded_vocab)
    fc = math.prod(shapes.pop(f"{PREFIX}fc.weight"))
    weights = sum(math.prod(shape) for key, shape in shapes.items() if key not in BUFFERS) + fc / steps
    kv = batch * serve.context * s.num_layers * 2 * s.groups * s.head_dim * serve.kv_bytes
    flops = batch * (2 * weights + s.num_layers * 2 * 2 * s.heads * s.head_dim * serve.context)
    return ForwardBytes(dense=weights * serve.weight_bytes / serve.tp, experts=0.0, kv=kv / serve.tp,
                        flops=flops / serve.tp)


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
