"""The parameters of each model chunk, in the order megatron-core registers them, and the buffers
its DDP and distributed optimizer build from them.

megatron-core's DDP (distributed/param_and_grad_buffer.py) puts a chunk's parameters into one
contiguous buffer per (dense | routed expert, param dtype, grad dtype), walking the parameters in
reverse registration order. With the distributed optimizer each parameter starts at a multiple of
64 elements, a parameter marked shared_embedding gets a bucket of its own, a bucket closes once it
holds bucket_size elements, and each bucket ends padded to lcm(data-parallel size, 128). The
parameters then live in that buffer (param.data is remapped) and so do the gradients (main_grad).
The distributed optimizer (optimizer/distrib_optimizer.py) gives data-parallel rank r the r-th of
dp equal slices of every bucket and keeps fp32 main copies and Adam moments for the parameter
elements inside its slice (padding has none). Routed experts are "expert parallel" (their own
buffer, sharded over the expert data-parallel group) only when EP > 1.
"""

from __future__ import annotations

import bisect
import functools
import itertools
import math
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.config.parallel_sizes import ParallelSizes
from megatron_mtp.config.pipeline_layout import Stage
from megatron_mtp.config.root import Config
from megatron_mtp.models.family import get_family
from megatron_mtp.models.tensor_table import is_moe_layer, mtp_is_moe, mtp_key_prefixes, mtp_own_rules
from megatron_mtp.platform.megatron_core import MTP_LAYER_ATTR  # module names (plan mirrors named_parameters)

BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
"""Bytes of a parameter (or gradient) of each training.precision."""


@dataclass(frozen=True)
class Param:
    name: str
    numel: int
    expert: bool = False
    """A routed expert's weight (in the expert-parallel buffer when EP > 1)."""
    linear: bool = False
    """A Transformer Engine linear weight (FP8 under training.fp8 with fp8_param_gather)."""
    shared_embedding: bool = False


def _local(cfg: Config, sizes: ParallelSizes, rule, te: bool) -> int:
    """Elements of one tensor (one expert's, for routed experts) on one rank: the family's global
    size, divided by the tensor-parallel ranks that split it."""
    split = rule.split == "tp" or (rule.split == "local" and not te)
    return rule.numel(cfg.model) // ((sizes.etp if rule.experts else sizes.tp) if split else 1)


def rule_param(cfg: Config, sizes: ParallelSizes, prefix: str, rule, te: bool, name: str = "") -> Param:
    module, leaf = rule.mcore.rsplit(".", 2)[-2:]
    linear = module.startswith("linear_") or module == "eh_proj"  # a TE linear weight (FP8 under training.fp8)
    return Param(prefix + (name or rule.mcore), _local(cfg, sizes, rule, te),
                 linear=linear and rule.role == "weight" and leaf == "weight",
                 expert=rule.experts and sizes.ep > 1)


# The order megatron-core registers a layer's MLP modules in, per spec (the attention's: the family's).
_DENSE_ORDER = {True: ("mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight"),
                False: ("pre_mlp_layernorm.weight", "mlp.linear_fc1.weight", "mlp.linear_fc2.weight")}
_EXPERT_FC1, _EXPERT_FC2 = "mlp.experts.experts.linear_fc1.weight", "mlp.experts.experts.linear_fc2.weight"


def layer_params(cfg: Config, sizes: ParallelSizes, prefix: str, moe: bool, te: bool) -> list[Param]:
    family = get_family(cfg.model.family)
    sized: dict[int, Param] = {}

    def param(rule, name: str = "") -> Param:
        # a rule's size and kind once per layer: a layer of 256 experts names the same two rules 512 times
        base = sized.get(id(rule))
        if base is None:
            base = sized[id(rule)] = rule_param(cfg, sizes, "", rule, te)
        return Param(prefix + (name or rule.mcore), base.numel, expert=base.expert, linear=base.linear)

    registration = getattr(family.table, "registration", None)
    if registration is not None:  # a family whose layers megatron-core's GPT specs do not build
        local = range(cfg.model.num_experts // sizes.ep)
        return [param(rule, name) for rule, name in registration(cfg.model, prefix, moe, te, local)]
    spec = "te" if te else "local"
    rules = {r.mcore: r for r in family.table.rules_at(cfg.model, prefix, moe, spec) if r.role != "buffer"}
    one = lambda name: [param(rules[name])] if name in rules else []  # noqa: E731
    out = [p for name in family.attention_order[te] for p in one(name)]
    if not moe:
        return out + [p for name in _DENSE_ORDER[te] for p in one(name)]
    out += one("pre_mlp_layernorm.weight") + one("mlp.router.weight")
    local = range(cfg.model.num_experts // sizes.ep)
    fc1, fc2 = rules[_EXPERT_FC1], rules[_EXPERT_FC2]
    if te:  # TEGroupedMLP: all fc1 weights, then all fc2 weights
        out += [param(fc1, f"mlp.experts.linear_fc1.weight{i}") for i in local]
        out += [param(fc2, f"mlp.experts.linear_fc2.weight{i}") for i in local]
    else:  # SequentialMLP: fc1 and fc2 of each expert in turn
        for i in local:
            out += [param(fc1, f"mlp.experts.local_experts.{i}.linear_fc1.weight"),
                    param(fc2, f"mlp.experts.local_experts.{i}.linear_fc2.weight")]
    if cfg.model.num_shared_experts:
        out += one("mlp.shared_experts.linear_fc1.weight") + one("mlp.shared_experts.linear_fc2.weight")
    return out


def sequential_mtp(cfg: Config) -> bool:
    """DeepSeek's sequential MTP modules (each with an embedding lookup and eh_proj), as opposed to
    parallel heads (a transformer layer and a norm each, no embedding: mtp_styles/parallel/model.py)."""
    return cfg.mtp.num_layers > 0 and get_style(cfg.mtp.style).chains_modules


def has_final_norm(cfg: Config, stage: Stage, last: bool) -> bool:
    """With MTP, megatron-core puts the decoder's final norm next to the last decoder layer; without
    it, on the loss stage."""
    if cfg.mtp.num_layers:
        return cfg.model.num_layers - 1 in stage.layers
    return last


def chunk_params(cfg: Config, sizes: ParallelSizes, stage: Stage, padded_vocab: int, last: bool,
                 te: bool) -> list[Param]:
    """The chunk's parameters in named_parameters() order. `last`: the loss stage (post_process)."""
    m, h = cfg.model, cfg.model.hidden_size
    vocab_rows = padded_vocab // sizes.tp
    out: list[Param] = []
    sequential = sequential_mtp(cfg)
    with_embedding = stage.embedding or (stage.mtp_layers > 0 and sequential)
    if with_embedding:
        # the sequential MTP stage keeps its own copy of the input embedding, tied to the first
        # stage's by an all-reduce (shared_embedding); so does the first stage when another stage
        # holds the copy. Parallel heads read no embedding: the last stage holds none.
        shared = sizes.pp > 1 and (sequential or m.tie_embeddings)
        out.append(Param("embedding.word_embeddings.weight", vocab_rows * h, shared_embedding=shared))
    for layer in stage.layers:
        out += layer_params(cfg, sizes, f"decoder.layers.{layer}.", is_moe_layer(cfg.model, layer), te)
    if has_final_norm(cfg, stage, last):
        out.append(Param("decoder.final_layernorm.weight", h))
    if sequential:
        for i in range(min(stage.mtp_layers, cfg.mtp.modules)):  # mtp.repeated_layer: one module for all depths
            p = f"mtp.layers.{i}."
            # enorm, hnorm, eh_proj, then the layer, then the module's final norm
            own = [rule_param(cfg, sizes, p, rule, te) for rule in mtp_own_rules()]
            out += own[:-1] + layer_params(cfg, sizes, f"{p}{MTP_LAYER_ATTR}.", mtp_is_moe(cfg.model), te) + own[-1:]
    if last and not (m.tie_embeddings and with_embedding):  # tied: the embedding's weight
        out.append(Param("output_layer.weight", vocab_rows * h, shared_embedding=m.tie_embeddings and sizes.pp > 1))
    if cfg.mtp.num_layers:  # a style's own modules (heads, a drafter) are registered after GPTModel's
        out += get_style(cfg.mtp.style).plan().params(cfg, sizes, stage, padded_vocab, te)
    return out


@dataclass(frozen=True)
class Buffer:
    """One DDP param-and-grad buffer."""

    expert: bool
    fp8: bool
    """Holds FP8 parameters (uint8 storage)."""
    dp: int
    """Size of the data-parallel group it is reduced (and, with the distributed optimizer, sharded) over."""
    numel: int
    """Elements including padding."""
    buckets: tuple[tuple[int, int], ...]
    """(start, end) of each bucket in the buffer."""
    params: tuple[tuple[int, int], ...]
    """(start, end) of each parameter in the buffer."""

    def _slice(self, lo: int, hi: int) -> tuple[int, int]:
        """(elements, parameters) of the buffer inside [lo, hi). Parameters lie in increasing,
        non-overlapping ranges, so the ones that meet the slice are a run found by bisection, and only
        its first and last can be cut: O(log n) per slice instead of a walk over every parameter."""
        i0 = bisect.bisect_right(self._ends, lo)
        i1 = bisect.bisect_left(self._starts, hi)
        if i1 <= i0:
            return 0, 0
        elements = self._prefix[i1] - self._prefix[i0]
        elements -= max(0, lo - self._starts[i0]) + max(0, self._ends[i1 - 1] - hi)
        return elements, i1 - i0

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [s for s, _ in self.params]

    @functools.cached_property
    def _ends(self) -> list[int]:
        return [e for _, e in self.params]

    @functools.cached_property
    def _prefix(self) -> list[int]:
        return [0, *itertools.accumulate(e - s for s, e in self.params)]

    def _rank_slices(self, dp_rank: int):
        for b_start, b_end in self.buckets:
            size = (b_end - b_start) // self.dp
            yield b_start + dp_rank * size, b_start + (dp_rank + 1) * size

    def shards(self) -> list[tuple[int, int]]:
        """``shard(r)`` of every data-parallel rank r at once: the same bisection, over every (bucket, rank)
        slice as arrays (a buffer of thousands of buckets over hundreds of ranks is millions of slices)."""
        import numpy as np

        if not self.params or not self.buckets:
            return [(0, 0)] * self.dp
        starts, ends = np.array(self._starts, dtype=np.int64), np.array(self._ends, dtype=np.int64)
        prefix, buckets = np.array(self._prefix, dtype=np.int64), np.array(self.buckets, dtype=np.int64)
        size = (buckets[:, 1] - buckets[:, 0]) // self.dp
        lo = buckets[:, :1] + np.arange(self.dp, dtype=np.int64)[None, :] * size[:, None]
        hi = lo + size[:, None]
        i0, i1 = np.searchsorted(ends, lo, side="right"), np.searchsorted(starts, hi, side="left")
        met = i1 > i0
        first, last = np.minimum(i0, len(starts) - 1), np.maximum(i1 - 1, 0)
        elements = (prefix[i1] - prefix[i0] - np.maximum(0, lo - starts[first]) - np.maximum(0, ends[last] - hi))
        elements, params = np.where(met, elements, 0).sum(axis=0), np.where(met, i1 - i0, 0).sum(axis=0)
        return list(zip(elements.tolist(), params.tolist()))

    def shard(self, dp_rank: int) -> tuple[int, int]:
        """(elements, parameters) inside data-parallel rank `dp_rank`'s slice of every bucket: the
        parameter elements its optimizer holds, and the parameters with at least one element there
        (each gets an Adam step counter)."""
        elements = params = 0
        for lo, hi in self._rank_slices(dp_rank):
            e, n = self._slice(lo, hi)
            elements, params = elements + e, params + n
        return elements, params


def _pad(n: int, divisor: int) -> int:
    return -(-n // divisor) * divisor


def layout_buffer(params: list[Param], dp: int, bucket_size: Optional[int], distributed: bool, expert: bool,
                  fp8: bool) -> Buffer:
    """megatron-core's _ParamAndGradBuffer index arithmetic for `params` (registration order)."""
    bucket_pad = math.lcm(dp, 128)
    start = bucket_start = 0
    buckets, ranges, in_bucket = [], [], 0

    def close(end: int) -> int:
        nonlocal bucket_start, in_bucket
        padded = _pad(end, bucket_pad) if distributed else end
        buckets.append((bucket_start, padded))
        bucket_start, in_bucket = padded, 0
        return padded

    end = 0
    for p in reversed(params):
        if distributed:
            start = _pad(start, 64)
        own_bucket = p.shared_embedding and distributed
        if own_bucket and in_bucket:
            start = close(start)
        end = start + p.numel
        ranges.append((start, end))
        in_bucket += 1
        if (bucket_size is not None and end - bucket_start >= bucket_size) or own_bucket:
            start = close(end)
        else:
            start = end
    if in_bucket:
        close(end)
    numel = buckets[-1][1] if buckets else 0
    return Buffer(expert=expert, fp8=fp8, dp=dp, numel=numel, buckets=tuple(buckets), params=tuple(ranges))


def chunk_buffers(params: list[Param], sizes: ParallelSizes, bucket_size: Optional[int], distributed: bool,
                  fp8_params: bool) -> list[Buffer]:
    """The buffers of one chunk: dense then expert-parallel, each split by param dtype (FP8 or not)
    in order of first appearance, as DDP groups them."""
    out = []
    for expert in (False, True):
        group = [p for p in params if p.expert == expert]
        kinds: dict[bool, list[Param]] = {}
        for p in group:
            kinds.setdefault(fp8_params and p.linear, []).append(p)
        for fp8, members in kinds.items():
            # dense gradients reduce (and the distributed optimizer shards) over data × context parallel ranks
            out.append(layout_buffer(members, sizes.edp if expert else sizes.dp * sizes.cp, bucket_size,
                                     distributed, expert, fp8))
    return out


def ddp_bucket_size(cfg: Config, sizes: ParallelSizes, pp_rank: int, vp_stage: int) -> Optional[int]:
    """Elements per bucket for a chunk (None: one bucket). Only the first chunk of pipeline rank 0
    is bucketed, and only with overlap_grad_reduce (megatron-core's DDP defaults; mtp.freeze_base
    turns the overlap off)."""
    p = cfg.parallel
    if not p.overlap_grad_reduce or cfg.mtp.freeze_base or pp_rank > 0 or vp_stage > 0:
        return None
    return p.bucket_size or max(40_000_000, 1_000_000 * sizes.dp * sizes.cp)


def trains(cfg: Config, param: Param) -> bool:
    """Whether a parameter takes gradients: all of them, or with mtp.freeze_base the MTP modules' alone
    (models/mtp_objective.py), and those the model's own fields train (a DSA warm-up: the indexers')."""
    return (not cfg.mtp.freeze_base or param.name.startswith(mtp_key_prefixes())) and cfg.model.trains(param.name)
