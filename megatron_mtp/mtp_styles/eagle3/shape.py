"""The EAGLE-3 drafter's shape, resolved from a run config (``mtp.eagle3``'s null fields filled in), and the style's
config checks. Imports no torch."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from megatron_mtp.errors import UserError

PREFIX = "mtp_eagle3."
"""The checkpoint keys of the drafter (one part, whatever its steps)."""


@dataclass(frozen=True)
class DrafterShape:
    """Everything the drafter's modules, its export and its counts need to know."""

    hidden: int
    """Its width: the target's (the token embeddings it reads are the target's)."""
    target_layers: int
    aux_layers: tuple[int, ...]
    num_layers: int
    heads: int
    groups: int
    head_dim: int
    ffn: int
    vocab: Optional[int]
    """The target's vocabulary (unpadded; None before the tokenizer is known)."""
    draft_vocab: Optional[int]
    """Tokens its head scores (the whole vocabulary when mtp.eagle3.draft_vocab_size is null)."""
    eps: float
    rope_theta: float
    norm_before_residual: bool
    norm_output: bool
    step_loss_decay: float
    train_lm_head: bool

    @property
    def restricted(self) -> bool:
        """Its head scores fewer tokens than the target's vocabulary (d2t/t2d map them)."""
        return self.draft_vocab is not None and self.vocab is not None and self.draft_vocab != self.vocab


def default_aux_layers(num_layers: int) -> list[int]:
    """speculators' default: a low, a middle and a high layer."""
    return [2, num_layers // 2, num_layers - 3]


def drafter_shape(cfg) -> DrafterShape:
    """The drafter of run config ``cfg`` (``mtp.eagle3`` with its null fields resolved)."""
    m, e = cfg.model, cfg.mtp.eagle3
    heads = e.num_attention_heads or m.num_attention_heads
    vocab = m.vocab_size
    return DrafterShape(
        hidden=m.hidden_size, target_layers=m.num_layers,
        aux_layers=tuple(e.aux_layers if e.aux_layers is not None else default_aux_layers(m.num_layers)),
        num_layers=e.num_layers, heads=heads, groups=e.num_query_groups or heads,
        head_dim=e.head_dim or m.hidden_size // heads, ffn=e.ffn_hidden_size or m.ffn_hidden_size,
        vocab=vocab, draft_vocab=e.draft_vocab_size if e.draft_vocab_size is not None else vocab,
        eps=m.norm_epsilon, rope_theta=float(m.rope_theta), norm_before_residual=e.norm_before_residual,
        norm_output=e.norm_output, step_loss_decay=e.step_loss_decay, train_lm_head=e.train_lm_head)


def tensor_shapes(cfg, padded_vocab: int) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> global shape of each of the drafter's tensors, in registration order (drafter.py), its
    ``d2t``/``t2d`` buffers last; ``padded_vocab``: the target's output rows, the head's with no draft vocabulary."""
    s = drafter_shape(cfg)
    h, q, kv = s.hidden, s.heads * s.head_dim, s.groups * s.head_dim
    out = {f"{PREFIX}fc.weight": (h, len(s.aux_layers) * h)}
    for i in range(s.num_layers):
        p, width = f"{PREFIX}layers.{i}.", 2 * h if i == 0 else h
        out[f"{p}input_layernorm.weight"] = (h,)
        if i == 0:
            out[f"{p}hidden_norm.weight"] = (h,)
        for name, rows in (("q", q), ("k", kv), ("v", kv)):
            out[f"{p}self_attention.linear_{name}.weight"] = (rows, width)
        out[f"{p}self_attention.linear_proj.weight"] = (h, q)
        out[f"{p}pre_mlp_layernorm.weight"] = (h,)
        out[f"{p}mlp.linear_fc1.weight"] = (2 * s.ffn, h)
        out[f"{p}mlp.linear_fc2.weight"] = (h, s.ffn)
    draft = s.draft_vocab or padded_vocab
    out[f"{PREFIX}final_layernorm.weight"] = (h,)
    out[f"{PREFIX}lm_head.weight"] = (draft, h)
    out[f"{PREFIX}d2t"] = (draft,)
    out[f"{PREFIX}t2d"] = (s.vocab or padded_vocab,)
    return out


BUFFERS = (f"{PREFIX}d2t", f"{PREFIX}t2d")
"""The drafter's integer buffers (the draft vocabulary's tables): no parameters."""


def check(cfg) -> None:
    """What mtp.style eagle3 needs of a run config, one sentence for the first thing it lacks (config/validate.py
    calls it when mtp.num_layers > 0)."""
    mtp, e, p = cfg.mtp, cfg.mtp.eagle3, cfg.parallel
    if not mtp.freeze_base:
        raise UserError("mtp.freeze_base=false does not work with mtp.style=eagle3, which always trains a drafter "
                        "beside a frozen target (the target in checkpoint.load); drop mtp.freeze_base")
    layers = cfg.model.num_layers
    ids = e.aux_layers if e.aux_layers is not None else default_aux_layers(layers)
    if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) > layers:
        which = "mtp.eagle3.aux_layers" if e.aux_layers is not None else "speculators' default aux layers"
        raise UserError(f"{which} {list(ids)} must be distinct layer ids within 0..{layers} (model.num_layers); "
                        "set mtp.eagle3.aux_layers to a few of them (a low, a middle and a high layer)")
    for name in ("num_layers", "num_attention_heads", "num_query_groups", "head_dim", "ffn_hidden_size",
                 "draft_vocab_size", "vocab_count_tokens"):
        value = getattr(e, name)
        if value is not None and value < 1:
            raise UserError(f"mtp.eagle3.{name} is {value}; set a positive number")
    shape = drafter_shape(cfg)
    if shape.heads % shape.groups:
        raise UserError(f"mtp.eagle3.num_query_groups={shape.groups} does not divide its {shape.heads} query heads; "
                        "each key/value head serves a whole group of them")
    if shape.vocab is not None and shape.draft_vocab > shape.vocab:
        raise UserError(f"mtp.eagle3.draft_vocab_size={shape.draft_vocab} exceeds the target's vocabulary of "
                        f"{shape.vocab} tokens; pick at most that many")
    if not e.step_loss_decay > 0:
        raise UserError(f"mtp.eagle3.step_loss_decay is {e.step_loss_decay}; it must be above 0")
    if p.pipeline != 1:
        raise UserError(f"parallel.pipeline={p.pipeline} is not built yet for mtp.style=eagle3, whose drafter on the "
                        "last stage reads the target's hidden states at mtp.eagle3.aux_layers, which megatron-core's "
                        "pipeline schedule does not carry between stages; set parallel.pipeline=1 (tensor, data "
                        "and expert parallelism work)")
    if p.tensor > 1:
        for name, value, field in (("number of query heads", shape.heads, "num_attention_heads"),
                                   ("number of key/value heads", shape.groups, "num_query_groups"),
                                   ("FFN width", shape.ffn, "ffn_hidden_size"),
                                   ("draft vocabulary size", shape.draft_vocab, "draft_vocab_size")):
            if value is not None and value % p.tensor:
                raise UserError(f"the EAGLE-3 drafter's {name} ({value}) is not a multiple of parallel.tensor="
                                f"{p.tensor}, over whose ranks it splits; set mtp.eagle3.{field} to a multiple of "
                                f"{p.tensor}")
    if cfg.kernels.chunked_output_loss is True:
        raise UserError("kernels.chunked_output_loss=true does not apply to mtp.style=eagle3: its targets are the "
                        "frozen target's whole logits over the draft vocabulary; set it to auto or false")
