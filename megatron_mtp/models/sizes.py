"""Analytic parameter counts and training FLOPs of a family's model, from its tensor table.

Used to check configs against published sizes and by benchmarks to predict cost ratios
(e.g. the MTP overhead: step time with D=1 over D=0 should follow the FLOPs ratio).
Counts follow the module structure built by megatron-core (models/megatron_model.py); vocabulary
rows are counted padded, as they are allocated. A family binds its table and its attention's score
width (deepseek_v3/size.py, gqa/size.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.models.tensor_table import Table, moe_layer_count, mtp_is_moe


@dataclass(frozen=True)
class LayerSizes:
    attention: int
    dense_mlp: int
    moe_total: int  # router + all routed experts + shared experts
    moe_active: int  # router + top-k routed experts + shared experts
    norms: int
    expert: int = 0  # one routed expert
    around_experts: int = 0  # router + shared experts: what a MoE layer's MLP reads whatever the routing


def layer_sizes(cfg: Config, table: Table) -> LayerSizes:
    """Parameters of one decoder layer's blocks, from the family's tensor table in the TE spelling;
    buffers are no parameters."""
    m = cfg.model
    block_rules = table.block_rules

    def total(rules, *, experts: bool = False, roles=("weight", "norm")) -> int:
        return sum(r.numel(m) for r in rules if r.experts == experts and r.role in roles)

    attention = block_rules(m, "attention", "te")
    dense, moe = block_rules(m, "dense_mlp", "te"), block_rules(m, "moe_mlp", "te") if m.num_experts else []
    expert = total(moe, experts=True)
    around_experts = total(moe)
    return LayerSizes(
        attention=total(attention),
        dense_mlp=total(dense),
        moe_total=around_experts + m.num_experts * expert,
        moe_active=around_experts + m.router_topk * expert,
        expert=expert,
        around_experts=around_experts,
        norms=total(attention, roles=("block_norm",)) + total(dense, roles=("block_norm",)),
    )


def mtp_own_size(cfg: Config) -> int:
    """What an MTP module or parallel head holds besides its transformer layer."""
    return sum(r.numel(cfg.model) for r in get_style(cfg.mtp.style).own_rules())


def parameter_counts(cfg: Config, padded_vocab: int, table: Table) -> dict[str, int]:
    """{'main': ..., 'mtp_unique': ..., 'main_active': ...} (MTP shares embedding and head)."""
    m = cfg.model
    s = layer_sizes(cfg, table)
    moe_layers = moe_layer_count(m)
    dense_layers = m.num_layers - moe_layers
    per_layer_common = s.attention + s.norms
    mlp_total = dense_layers * s.dense_mlp + moe_layers * s.moe_total
    mlp_active = dense_layers * s.dense_mlp + moe_layers * s.moe_active
    embed = padded_vocab * m.hidden_size
    head = 0 if m.tie_embeddings else padded_vocab * m.hidden_size
    main = m.num_layers * per_layer_common + mlp_total + embed + head + m.hidden_size
    mtp_mlp = s.moe_total if mtp_is_moe(m) else s.dense_mlp
    # a head: one layer and its final norm (mtp_styles/parallel/model.py); a module: enorm, hnorm, eh_proj, final norm
    mtp_layer = per_layer_common + mtp_mlp + mtp_own_size(cfg)
    return {
        "main": main,
        "main_active": m.num_layers * per_layer_common + mlp_active + embed + head + m.hidden_size,
        "mtp_unique": cfg.mtp.modules * mtp_layer,
    }


def training_flops_per_token(cfg: Config, padded_vocab: int, mtp_layers: int, table: Table,
                             score_width: int) -> float:
    """Forward+backward FLOPs per token (3 × forward), matmuls and attention scores; ``score_width``:
    the attention's query-key plus value width summed over heads."""
    m = cfg.model
    s = layer_sizes(cfg, table)
    seq = cfg.training.seq_length
    # causal attention: QK^T and AV over (on average) half the sequence
    attn_scores = 2 * score_width * seq / 2
    moe_layers = moe_layer_count(m)
    dense_layers = m.num_layers - moe_layers
    mlp_active = s.moe_active if mtp_is_moe(m) else s.dense_mlp
    layer = lambda mlp: 2 * (s.attention + mlp) + attn_scores  # noqa: E731
    head = 2 * padded_vocab * m.hidden_size
    forward = dense_layers * layer(s.dense_mlp) + moe_layers * layer(s.moe_active) + head
    own = get_style(cfg.mtp.style).own_flops(cfg)  # a module's eh_proj (a head has none)
    forward += mtp_layers * (layer(mlp_active) + own + head)
    return 3.0 * forward


def mtp_only_flops_per_token(family, cfg: Config, padded_vocab: int, mtp_layers: int) -> float:
    """FLOPs per token of an MTP-only step (mtp.freeze_base) of any family (its
    ``training_flops_per_token``): the main model's forward, then each sequential MTP module forward
    and backward, except the frozen output head's weight gradient (its backward takes only the input
    gradient: 2 × its forward in all). eh_proj's input gradient stays: enorm and hnorm, before it,
    are trainable MTP parameters. A separate drafter instead (its style's ``drafter_flops``): each of its K steps
    forward and backward over all its weights (its output table included: it trains) and its attention over the
    stored keys."""
    base = family.training_flops_per_token(cfg, padded_vocab, 0) / 3.0
    style = get_style(cfg.mtp.style)
    if style.separate_drafter:  # its weights and its attention over the stored keys (the style's count)
        return base + 3.0 * mtp_layers * style.drafter_flops(family, cfg, padded_vocab)
    full = family.training_flops_per_token(cfg, padded_vocab, mtp_layers) / 3.0
    head = 2 * padded_vocab * cfg.model.hidden_size
    mtp_forward = full - base  # per module: its layer, eh_proj and the head
    return base + 3.0 * mtp_forward - mtp_layers * head


def assistant_weights(family, cfg: Config, padded_vocab: int):
    """(the parameters of a family's separate drafter, the run config with its model config: its layers and widths,
    the target's key widths) for mtp.style assistant."""
    import dataclasses
    import math

    drafter = family.style_part(cfg.mtp.style)
    weights = sum(math.prod(t.shape) for t in drafter.tensors(cfg, padded_vocab) if not t.buffer)
    return weights, dataclasses.replace(cfg, model=drafter.model(cfg))
