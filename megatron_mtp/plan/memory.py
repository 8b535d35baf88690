"""Peak memory of every pipeline rank of a run, from the config objects training builds from.

Design. Nothing is estimated from totals: the plan walks the same placement training uses
(config.pipeline_layout.stages: which layers, embedding, MTP and loss each (pipeline rank,
virtual chunk) holds), the same parallel sizes (config.parallel_sizes) and the same kernel choices
(platform.features.resolve_features for the GPU platform it targets), and adds up
  model state  exactly: every parameter of every chunk in registration order (params.py), laid out
               in megatron-core's DDP buffers with their padding, and the distributed optimizer's
               fp32 main copies and Adam moments for this data-parallel rank's slice of each bucket;
               tests/dist/test_plan_exact.py compares it byte for byte with built ranks;
  FP8 caches   Transformer Engine's FP8 weight copies (row- and column-wise, 1 byte each);
  activations  per micro-batch, the tensors each layer saves for backward (activations.py, checked
               against saved_tensors_hooks on CPU), times the micro-batches the schedule holds in
               flight at its peak (schedule.py), plus each in-flight chunk output the pipeline keeps;
  workspace    the largest transient of the step (a layer recomputed in backward, the logits, the
               expert dispatch buffers) plus a fixed allowance for the CUDA context, NCCL and
               library workspaces and allocator fragmentation.
Every number carries its assumptions (Plan.assumptions); the report prints them.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Optional

from megatron_mtp.config import pipeline_layout
from megatron_mtp.config.parallel_sizes import ParallelSizes
from megatron_mtp.config.root import Config
from megatron_mtp.config.validate import validate
from megatron_mtp.config.vocab import resolve_vocab
from megatron_mtp.errors import UserError
from megatron_mtp.models.tensor_table import is_moe_layer, mtp_is_moe
from megatron_mtp.plan import activations as act
from megatron_mtp.plan import schedule
from megatron_mtp.plan.assumptions import assumptions
from megatron_mtp.plan.params import (
    BYTES,
    Buffer,
    chunk_buffers,
    chunk_params,
    ddp_bucket_size,
    trains,
)
from megatron_mtp.plan.stage_activations import chunk_activations, head_grad_bytes, recompute_modules
from megatron_mtp.platform.detect import Platform
from megatron_mtp.platform.features import Features, resolve_features
from megatron_mtp.platform.gpus import FIXED_ALLOWANCE, Gpu
from megatron_mtp.platform.low_precision import check_recipe


@dataclass(frozen=True)
class Target:
    """What the plan is for: the platform's kernels and whether model state is laid out TE-style."""

    platform: Platform
    features: Features
    kernels: act.Kernels

    @property
    def te(self) -> bool:
        return self.platform.use_te


def target(cfg: Config, cpu: bool = False) -> Target:
    if cpu:
        plat = Platform(device="cpu", backend="gloo", use_te=False)
        features = resolve_features(cfg, plat)
        return Target(plat, features, act.cpu_kernels(features))
    plat = Platform(device="cuda", backend="nccl", use_te=True)
    # the GPU nodes, not the machine planning, need DeepEP or DeepSpeed: check the rest of the config
    local = cfg.replace(parallel=dataclasses.replace(cfg.parallel, token_dispatcher="alltoall"),
                        optimizer=dataclasses.replace(cfg.optimizer, cpu_optimizer="torch"))
    features = resolve_features(local, plat)
    return Target(plat, features, act.gpu_kernels(features, fp8=cfg.training.fp8 is not None))


@dataclass(frozen=True)
class StateBytes:
    """Model state of one rank (all its chunks)."""

    params: int
    grads: int
    optimizer: int
    """Optimizer state in device memory: main parameters, Adam moments, step counters."""
    optimizer_host: int = 0
    """Offloaded optimizer state (host memory)."""
    fp8_caches: int = 0

    @property
    def device(self) -> int:
        return self.params + self.grads + self.optimizer + self.fp8_caches


def _fp8_params(cfg: Config, tgt: Target) -> bool:
    return tgt.te and cfg.training.fp8 is not None and cfg.training.fp8_param_gather


def _rank_chunks(cfg: Config, sizes: ParallelSizes, pp_rank: int, tgt: Target, vocab: int) -> list[tuple]:
    """(stage, its parameters) of each model chunk a rank holds."""
    stages = model_stages(cfg)
    return [(st, chunk_params(cfg, sizes, st, vocab, last=st is stages[-1], te=tgt.te))
            for st in stages if st.pp_rank == pp_rank]


def rank_buffers(cfg: Config, sizes: ParallelSizes, pp_rank: int, tgt: Target, vocab: int,
                 chunks: Optional[list] = None) -> list[Buffer]:
    """The DDP buffers of a rank: of the parameters that train (frozen ones stay outside DDP). ``chunks``: the
    rank's ``_rank_chunks``, where the caller has them."""
    out = []
    for st, params in chunks or _rank_chunks(cfg, sizes, pp_rank, tgt, vocab):
        out += chunk_buffers([p for p in params if trains(cfg, p)], sizes,
                             ddp_bucket_size(cfg, sizes, pp_rank, st.vp_stage), cfg.parallel.distributed_optimizer,
                             _fp8_params(cfg, tgt))
    return out


def frozen_params(cfg: Config, chunks: list) -> list:
    """A rank's frozen parameters (mtp.freeze_base, a DSA warm-up's non-indexers) of its ``_rank_chunks``: plain
    tensors outside DDP, no gradient or optimizer state."""
    return [p for _, params in chunks for p in params if not trains(cfg, p)]


def state_bytes(cfg: Config, sizes: ParallelSizes, pp_rank: int, tgt: Target, vocab: int,
                dp_rank: Optional[int] = None, edp_rank: Optional[int] = None) -> StateBytes:
    """Params, grads and optimizer state of a rank; dp_rank/edp_rank None: the worst such rank."""
    t, o = cfg.training, cfg.optimizer
    p_bytes, g_bytes = BYTES[t.precision], 4 if t.precision == "fp32" or t.grad_reduce_dtype == "fp32" else 2
    main = 0 if t.precision == "fp32" else 4  # fp32 parameters are their own main copy
    moments = 2 * (2 if (o.precision_aware and o.moment_dtype == "bf16") else 4)
    chunks = _rank_chunks(cfg, sizes, pp_rank, tgt, vocab)
    buffers = rank_buffers(cfg, sizes, pp_rank, tgt, vocab, chunks)
    params = grads = optimizer = fp8 = 0
    for p in frozen_params(cfg, chunks):  # FP8 parameters: 1 byte and a column-wise copy
        fp8_param = _fp8_params(cfg, tgt) and p.linear
        params += p.numel * (1 if fp8_param else p_bytes)
        fp8 += p.numel if fp8_param else 0
    distributed = cfg.parallel.distributed_optimizer
    for b in buffers:
        unpadded = sum(e - s for s, e in b.params)
        numel = b.numel if distributed else unpadded
        params += numel * (1 if b.fp8 else p_bytes)
        grads += numel * g_bytes
        if b.fp8:  # FP8 parameters hold the row-wise data in the buffer and a column-wise copy beside it
            fp8 += unpadded
        if distributed:
            rank = edp_rank if b.expert else dp_rank
            shards = b.shards() if rank is None else [b.shard(rank)]
            optimizer += max(e * (main + moments) + 4 * n for e, n in shards)
        else:
            optimizer += unpadded * (main + moments) + 4 * len(b.params)
    if t.fp8 is not None and tgt.te and not _fp8_params(cfg, tgt):
        fp8 = 2 * _linear_elements(cfg, sizes, pp_rank, tgt, vocab)  # cached FP8 copies of bf16 weights
    host = int(optimizer * o.offload_fraction)
    return StateBytes(params=params, grads=grads, optimizer=optimizer - host, optimizer_host=host, fp8_caches=fp8)


def save_host_bytes(cfg: Config, sizes: ParallelSizes, pp_rank: int, tgt: Target, vocab: int) -> dict[str, int]:
    """Host memory a checkpoint save takes on the worst data-parallel rank of a pipeline rank, per
    checkpoint.optimizer_format (each optimizer element: its fp32 parameter and the two moments):
      parallel     the rank's own optimizer shard, staged for the writer;
      reshardable  megatron-core's fully_reshardable save all-gathers every data-parallel shard of the
                   rank's model-parallel part onto every rank before writing: its whole optimizer state.
    Without the distributed optimizer both are the rank's (unsharded) optimizer state."""
    o = cfg.optimizer
    per_element = 4 + 2 * (2 if (o.precision_aware and o.moment_dtype == "bf16") else 4)
    shard = whole = 0
    for b in rank_buffers(cfg, sizes, pp_rank, tgt, vocab):
        unpadded = sum(e - s for s, e in b.params)
        whole += unpadded * per_element
        if cfg.parallel.distributed_optimizer:
            shard += max(e for e, _ in b.shards()) * per_element
        else:
            shard += unpadded * per_element
    return {"parallel": shard, "reshardable": whole}


def _linear_elements(cfg: Config, sizes: ParallelSizes, pp_rank: int, tgt: Target, vocab: int) -> int:
    stages = model_stages(cfg)
    return sum(p.numel for st in stages if st.pp_rank == pp_rank
               for p in chunk_params(cfg, sizes, st, vocab, last=st is stages[-1], te=tgt.te) if p.linear)


def model_stages(cfg: Config) -> list[pipeline_layout.Stage]:
    p = cfg.parallel
    return pipeline_layout.stages(cfg.model.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                  p.pipeline_layout)


@dataclass
class RankMemory:
    pp_rank: int
    state: StateBytes
    activations: float
    """Saved activations of the in-flight micro-batches at the schedule's peak."""
    pipeline_outputs: float
    """Chunk outputs kept until their backward: none on GPU (megatron-core's deallocate_pipeline_outputs
    frees each once sent), all in-flight ones on CPU (where the trainer keeps them, see
    models/megatron_config.py)."""
    workspace: float
    save_host: dict
    """Host bytes a checkpoint save takes on this rank, per optimizer format (save_host_bytes)."""
    in_flight: int
    per_chunk: tuple[int, ...]
    chunk_bytes: tuple[float, ...]
    """Activation bytes of one micro-batch on each chunk."""

    @property
    def total(self) -> float:
        return self.state.device + self.activations + self.pipeline_outputs + self.workspace


@dataclass
class Plan:
    cfg: Config
    sizes: ParallelSizes
    gpu: Gpu
    target: Target
    num_micro: int
    ranks: list[RankMemory]
    assumptions: list[str] = field(default_factory=list)
    imbalance: float = 1.0

    @property
    def worst(self) -> RankMemory:
        return max(self.ranks, key=lambda r: r.total)

    @property
    def fits(self) -> bool:
        return self.worst.total <= self.gpu.memory_bytes


def capacity_bound(cfg: Config, imbalance: float) -> float:
    """The routed tokens an expert receives over the balanced count once a capacity applies: at most
    model.moe_capacity_factor (tokens beyond it are dropped), exactly it when padded to capacity."""
    cap = cfg.model.moe_capacity_factor
    if cap is None:
        return imbalance
    return cap if cfg.model.moe_pad_to_capacity else min(imbalance, cap)


def make_plan(cfg: Config, world: int, gpu: Gpu, cpu: bool = False, imbalance: float = 1.0) -> Plan:
    """The memory plan of `cfg` on `world` ranks (UserError for a layout that cannot run)."""
    if not math.isfinite(imbalance) or imbalance < 1.0:
        raise UserError(f"--routing-imbalance {imbalance} must be at least 1 (1: every expert-parallel rank "
                        "receives the average number of tokens)")
    sizes = validate(cfg, world)
    if not cpu:
        check_recipe(cfg.training.fp8, gpu.capability, gpu.name)
    imbalance = capacity_bound(cfg, imbalance)
    tgt = target(cfg, cpu)
    vocab = resolve_vocab(cfg)
    t = cfg.training
    num_micro = t.global_batch_size // (t.micro_batch_size * sizes.dp)
    d = act.dims_of(cfg, vocab, imbalance)
    stages = model_stages(cfg)
    grouped = tgt.features.grouped_gemm
    ranks = []
    for r in range(sizes.pp):
        mine = [s for s in stages if s.pp_rank == r]
        per_chunk = [chunk_activations(cfg, s, d, tgt.kernels, grouped, head_grad_bytes(cfg, sizes, s, vocab, tgt.te)
                                       ).total for s in mine]
        pk = schedule.peak(sizes.pp, r, sizes.vpp, num_micro, per_chunk, cfg.parallel.moe_a2a_overlap)
        if cfg.mtp.freeze_base:  # forward-only schedule; each micro-batch's MTP graph is freed in its forward
            pk = schedule.forward_only_peak(per_chunk)
        kept = sizes.pp > 1 and tgt.platform.is_cpu and not cfg.mtp.freeze_base
        outputs = sum(n for n, s in zip(pk.per_chunk, mine) if not s.loss) * d.hidden * d.local * d.act_bytes
        ranks.append(RankMemory(
            pp_rank=r, state=state_bytes(cfg, sizes, r, tgt, vocab), activations=pk.bytes,
            pipeline_outputs=outputs if kept else 0, workspace=_workspace(cfg, mine, d, tgt, grouped),
            save_host=save_host_bytes(cfg, sizes, r, tgt, vocab),
            in_flight=pk.in_flight, per_chunk=pk.per_chunk, chunk_bytes=tuple(per_chunk)))
    plan = Plan(cfg=cfg, sizes=sizes, gpu=gpu, target=tgt, num_micro=num_micro, ranks=ranks, imbalance=imbalance)
    plan.assumptions = assumptions(plan)
    return plan


def _workspace(cfg: Config, mine, d: act.Dims, tgt: Target, grouped: bool) -> float:
    """The largest transient of the step on this rank, plus the fixed allowance."""
    k, mods = tgt.kernels, recompute_modules(cfg)
    moe_here = any(is_moe_layer(cfg.model, i) for s in mine for i in s.layers) or (
        any(s.mtp_layers for s in mine) and mtp_is_moe(cfg.model))
    candidates = [0.0]
    if cfg.recompute.granularity != "none":  # backward rebuilds what was dropped, one layer at a time
        full = act.decoder_layer(d, k, frozenset(), moe_here, grouped).total
        kept = act.decoder_layer(d, k, mods, moe_here, grouped).total if mods else 0.0
        candidates.append(full - kept)
    if any(s.loss for s in mine) and k.output_chunk:
        # a chunk's logits and teacher logits (the matmul's dtype, then fp32), the probabilities and their
        # gradient in backward; the output weight's fp32 gradient accumulated over the chunks, then cast
        rows = min(k.output_chunk, d.tokens)
        candidates.append(rows * d.vocab * (2 * d.act_bytes + 3 * act.FP32) +
                          d.vocab * d.hidden * (act.FP32 + d.act_bytes))
    elif any(s.loss for s in mine):  # logits in the compute dtype next to the saved softmax or gradient
        candidates.append(d.tokens * d.vocab * d.act_bytes)
    if moe_here:  # dispatched tokens: the all-to-all output and its gradient
        candidates.append(2 * d.routed * d.hidden * d.act_bytes)
    if cfg.mtp.freeze_base and any(s.layers for s in mine):  # a frozen layer's no-grad forward, one at a time
        candidates.append(act.decoder_layer(d, k, frozenset(), moe_here, grouped).total)
    if cfg.mtp.head_by_head_backward and any(s.mtp_layers for s in mine):  # one head's graph, then freed
        candidates.append(act.decoder_layer(d, k, frozenset(), mtp_is_moe(cfg.model), grouped).total +
                          act.output_and_loss(d, k, 0).total)
    fixed = FIXED_ALLOWANCE if not tgt.platform.is_cpu else 0
    return max(candidates) + fixed


def with_overrides(cfg: Config, overrides: list[str]) -> Config:
    from megatron_mtp.config.base import apply_override, from_dict

    data = cfg.to_dict()
    for item in overrides:
        apply_override(data, type(cfg), item)
    return from_dict(type(cfg), data)


def suggestions(plan: Plan, world: int) -> list[tuple[str, float]]:
    """Changes that lower the worst rank, in the order to try them, each with its predicted total."""
    cfg, p, r, o = plan.cfg, plan.cfg.parallel, plan.cfg.recompute, plan.cfg.optimizer
    candidates = []
    selective = set(r.modules) if r.granularity == "selective" else set()
    # MLA's up-projections only where the family's attention is MLA
    mla = list(cfg.model.RECOMPUTE_MODULES)
    for extra in ([*mla, "mlp"], [*mla, "mlp", "moe", "layernorm"]):
        if not set(extra) <= selective and r.granularity != "full":
            mods = ",".join(sorted(selective | set(extra)))
            candidates.append(["recompute.granularity=selective", f"recompute.modules=[{mods}]"])
    if p.pipeline_layout is None:
        candidates.append([f"parallel.pipeline={p.pipeline * 2}"])
        if (p.virtual_pipeline or 1) == 1 and p.pipeline > 1:
            candidates.append(["parallel.virtual_pipeline=2"])
    etp = p.expert_tensor or p.tensor
    if cfg.model.num_experts and cfg.model.num_experts % (p.expert * 2) == 0:
        candidates.append([f"parallel.expert={p.expert * 2}"] + (["parallel.expert_tensor=1"] if etp > 1 else []))
    if not (o.precision_aware and o.moment_dtype == "bf16") and cfg.training.precision != "fp32":
        candidates.append(["optimizer.precision_aware=true", "optimizer.moment_dtype=bf16"])
    if o.offload_fraction < 0.5 and cfg.training.precision != "fp32":
        candidates.append(["optimizer.precision_aware=true", "optimizer.moment_dtype=fp32",
                           "optimizer.offload_fraction=0.5"])
    out = []
    for overrides in candidates:
        try:
            alt = make_plan(with_overrides(cfg, overrides), world, plan.gpu, plan.target.platform.is_cpu,
                            plan.imbalance)
        except UserError:
            continue
        if alt.worst.total < plan.worst.total:
            out.append((" ".join(overrides), alt.worst.total))
    return out
