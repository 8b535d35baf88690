"""Config checks that run before any process group starts. Each failure is one sentence naming the field.

These are the rules that hold on every platform; what depends on the machine (GPU, Transformer
Engine, DeepEP) is decided in platform/features.py once the platform is known.
"""

from __future__ import annotations

import math
from typing import Optional

from megatron_mtp.config import pipeline_layout
from megatron_mtp.config.mtp_style import family_styles, get_style, style_names
from megatron_mtp.config.parallel_sizes import ParallelSizes, parallel_sizes
from megatron_mtp.config.performance import FAMILY_RECOMPUTE_MODULES, RECOMPUTE_MODULES
from megatron_mtp.config.root import Config
from megatron_mtp.config.validate_run import check_intervals_and_timeouts
from megatron_mtp.config.wandb_env import check_installed
from megatron_mtp.errors import UserError, same_on_every_rank


def validate(cfg: Config, world_size: Optional[int] = None) -> ParallelSizes:
    """Raise UserError for the first inconsistency found (world_size: processes actually launched); every
    rank of a job raises the same one, so it is printed once (errors.same_on_every_rank)."""
    with same_on_every_rank():
        return _validate(cfg, world_size)


def _validate(cfg: Config, world_size: Optional[int]) -> ParallelSizes:
    _positive(cfg, ["model.num_layers", "model.hidden_size", "model.num_attention_heads", "parallel.tensor",
                    "parallel.pipeline", "parallel.expert", "training.max_steps", "training.seq_length",
                    "training.micro_batch_size", "training.global_batch_size"])
    if cfg.mtp.num_layers < 0:
        raise UserError(f"mtp.num_layers is {cfg.mtp.num_layers}; it must be 0 (no MTP) or a positive depth")
    check_family(cfg)
    _moe_counts(cfg)
    sizes = _parallel(cfg, world_size)
    _moe(cfg)
    _mtp_and_numbers(cfg)
    _mtp_style(cfg)
    _recompute(cfg, sizes)
    _family_overlap(cfg)
    _overlap(cfg, sizes)
    check_intervals_and_timeouts(cfg)
    _optimizer(cfg)
    check_installed(cfg.logging)
    if cfg.data.reset_position_ids:
        raise UserError("data.reset_position_ids=true would change nothing: megatron-core's rotary embeddings, "
                        "which every family here uses, take positions from the sequence length, not from "
                        "position_ids; set it to false (data.reset_attention_mask keeps documents apart)")
    return sizes


def _parallel(cfg: Config, world_size: Optional[int]) -> ParallelSizes:
    m, p, t = cfg.model, cfg.parallel, cfg.training
    if p.world_size is not None and world_size is not None and p.world_size != world_size:
        raise UserError(f"parallel.world_size is {p.world_size} but {world_size} processes were launched; "
                        "launch that many processes or change parallel.world_size")
    for name in ("virtual_pipeline", "expert_tensor", "bucket_size"):
        value = getattr(p, name)
        if value is not None and value < 1:
            raise UserError(f"parallel.{name} is {value}; it must be a positive integer or null")
    if p.context < 1:
        raise UserError(f"parallel.context is {p.context}; it must be a positive integer (1: no context parallelism)")
    if p.context > 1:
        _context_parallel(cfg)
    stages = pipeline_layout.stages(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                    p.pipeline_layout)
    vpp = len(stages) // p.pipeline
    if vpp > 1 and p.pipeline == 1:
        raise UserError("parallel.virtual_pipeline > 1 needs parallel.pipeline > 1 (the interleaved schedule "
                        "spreads chunks over pipeline ranks)")
    sizes = parallel_sizes(cfg, world_size, vpp)
    if p.expert > 1 and m.num_experts == 0:
        raise UserError("parallel.expert > 1 needs a MoE model; set model.num_experts > 0 or parallel.expert=1")
    if m.num_experts and m.num_experts % p.expert:
        raise UserError(f"model.num_experts={m.num_experts} is not divisible by parallel.expert={p.expert}; "
                        "every expert-parallel rank must hold the same number of experts")
    if m.num_experts and m.moe_ffn_hidden_size % sizes.etp:
        raise UserError(f"model.moe_ffn_hidden_size={m.moe_ffn_hidden_size} is not divisible by the expert "
                        f"tensor-parallel size {sizes.etp}; change parallel.expert_tensor")
    sp = p.sequence_parallel if p.sequence_parallel is not None else p.tensor > 1
    if m.num_experts and p.tensor > 1 and not sp:
        raise UserError("parallel.sequence_parallel is false but MoE with parallel.tensor > 1 needs sequence "
                        "parallelism; set parallel.sequence_parallel=true (or null)")
    if sp and p.tensor == 1:
        raise UserError("parallel.sequence_parallel=true needs parallel.tensor > 1")
    if sp and t.seq_length % p.tensor:
        raise UserError(f"training.seq_length={t.seq_length} must be divisible by parallel.tensor={p.tensor} "
                        "with sequence parallelism")
    if m.num_attention_heads % p.tensor:
        raise UserError(f"model.num_attention_heads={m.num_attention_heads} is not divisible by "
                        f"parallel.tensor={p.tensor}")
    per_step = t.micro_batch_size * sizes.dp
    if t.global_batch_size % per_step:
        raise UserError(f"training.global_batch_size={t.global_batch_size} must be a multiple of "
                        f"micro_batch_size × data-parallel size = {t.micro_batch_size}×{sizes.dp}={per_step}")
    micro = t.global_batch_size // per_step
    _rampup(t, per_step, p.pipeline if vpp > 1 else 1)
    if vpp > 1 and micro % p.pipeline:
        raise UserError(f"the interleaved schedule needs the micro-batches per step ({micro} = global batch / "
                        f"(micro batch × data parallel)) to be a multiple of parallel.pipeline={p.pipeline}; "
                        "change training.global_batch_size or training.micro_batch_size")
    if p.token_dispatcher == "flex" and p.tensor * p.expert == 1:
        raise UserError("parallel.token_dispatcher=flex needs parallel.tensor × parallel.expert > 1; use alltoall")
    _capacity(m, p)
    return sizes


def _context_parallel(cfg: Config) -> None:
    """What parallel.context > 1 needs (models/context_parallel.py), one sentence for the first it lacks."""
    p, t, d, mtp = cfg.parallel, cfg.training, cfg.data, cfg.mtp
    chunks = 2 * p.context * p.tensor  # each CP rank's 2 chunks, split again over the TP ranks (sequence parallel)
    if t.seq_length % chunks:
        raise UserError(f"training.seq_length={t.seq_length} must be divisible by 2 × parallel.context × "
                        f"parallel.tensor = {chunks}: each context-parallel rank holds 2 chunks of a sequence, "
                        "split again over the tensor-parallel ranks")
    unsupported = [
        (d.reset_attention_mask, "data.reset_attention_mask (attention within documents)"),
        (mtp.num_layers and not get_style(mtp.style).context_parallel, f"mtp.style={mtp.style}"),
        (mtp.num_layers and mtp.freeze_base, "mtp.freeze_base"),
        (mtp.num_layers and d.eod_mask_loss, "data.eod_mask_loss with MTP layers (their masks run along the "
                                             "whole sequence)"),
    ]
    for on, what in unsupported:
        if on:
            raise UserError(f"parallel.context={p.context} does not work with {what} yet; set parallel.context=1 "
                            "or turn that off")


def _capacity(m, p) -> None:
    """Token dropping's fields (megatron-core asserts the same deeper down, or silently ignores them)."""
    if m.moe_capacity_factor is not None:
        if not m.moe_capacity_factor > 0:
            raise UserError(f"model.moe_capacity_factor is {m.moe_capacity_factor}; use a positive factor (1.0: an "
                            "even share per expert) or null for no token dropping")
        if not m.num_experts:
            raise UserError("model.moe_capacity_factor is set on a dense model (model.num_experts=0); leave it null")
    elif m.moe_pad_to_capacity:
        raise UserError("model.moe_pad_to_capacity=true needs model.moe_capacity_factor (the capacity it pads to)")
    if m.moe_pad_to_capacity and p.token_dispatcher == "flex" and p.flex_backend == "deepep":
        raise UserError("model.moe_pad_to_capacity=true does not work with parallel.token_dispatcher=flex on DeepEP; "
                        "use parallel.flex_backend=hybridep or the alltoall dispatcher")


def _rampup(t, per_step: int, interleave: int) -> None:
    if t.rampup_batch_size is None:
        return
    ramp = t.rampup_batch_size
    if len(ramp) != 3 or any(not isinstance(v, int) or isinstance(v, bool) for v in ramp) \
            or ramp[0] < 1 or ramp[1] < 1 or ramp[2] < 0:
        raise UserError(f"training.rampup_batch_size is {ramp}; give [START, INCREMENT, SAMPLES] as positive "
                        "integers (SAMPLES may be 0), e.g. [16, 16, 10000]")
    start, increment, _ = ramp
    if start > t.global_batch_size or (t.global_batch_size - start) % increment:
        raise UserError(f"training.rampup_batch_size {ramp} does not reach training.global_batch_size="
                        f"{t.global_batch_size}: START must be at most it and the difference a multiple of INCREMENT")
    unit = per_step * interleave
    for size in range(start, t.global_batch_size + 1, increment):
        if size % unit:
            why = " times parallel.pipeline (the interleaved schedule)" if interleave > 1 else ""
            raise UserError(f"training.rampup_batch_size {ramp} passes a global batch of {size}, not a multiple of "
                            f"micro_batch_size × data-parallel size{why} = {unit}; pick START and INCREMENT "
                            "that are multiples of it")


def check_family(cfg: Config) -> None:
    """The family's own checks (its model config class's ``check``: models/<family>/validate.py) and
    the MTP styles it builds (those it declares, and every style that works for any family)."""
    m, built = cfg.model, family_styles(cfg.model.MTP_STYLES)
    m.check(cfg)
    if cfg.mtp.style not in built:
        raise UserError(f"mtp.style={cfg.mtp.style} is not built for model.family={m.family} (it builds "
                        f"{', '.join(built)}); set mtp.style={built[0]}")


def _moe_counts(cfg: Config) -> None:
    """The MoE sizes every later check divides by."""
    m = cfg.model
    if m.num_experts < 0:
        raise UserError(f"model.num_experts is {m.num_experts}; it must be 0 (a dense model) or the number of "
                        "routed experts per MoE layer")
    if not m.num_experts:
        return
    for name in ("router_topk", "moe_ffn_hidden_size"):
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} is {getattr(m, name)}; a MoE model (model.num_experts="
                            f"{m.num_experts}) needs it to be 1 or more")


def _moe(cfg: Config) -> None:
    m = cfg.model
    if not m.num_experts:
        return
    if m.router_topk > m.num_experts:
        raise UserError(f"model.router_topk={m.router_topk} exceeds model.num_experts={m.num_experts}")
    if m.first_k_dense > m.num_layers:
        raise UserError(f"model.first_k_dense={m.first_k_dense} exceeds model.num_layers={m.num_layers}")
    if m.router_num_groups:
        if m.num_experts % m.router_num_groups:
            raise UserError(f"model.num_experts={m.num_experts} is not divisible by "
                            f"model.router_num_groups={m.router_num_groups}")
        if not m.router_group_topk or m.router_group_topk > m.router_num_groups:
            raise UserError("model.router_group_topk must be set and at most model.router_num_groups when "
                            "group-limited routing is on (router_num_groups)")
        per_group = m.num_experts // m.router_num_groups
        if m.router_topk > m.router_group_topk * per_group:
            raise UserError(f"model.router_topk={m.router_topk} exceeds the experts reachable in "
                            f"router_group_topk={m.router_group_topk} groups of {per_group}")
    elif m.router_group_topk:
        raise UserError("model.router_group_topk is set but model.router_num_groups is null; set both or neither")
    if m.router_score_function == "sigmoid" and not m.router_norm_topk_prob and m.router_topk > 1:
        raise UserError("model.router_norm_topk_prob=false with sigmoid scores is not supported by megatron-core "
                        "(it always renormalises the selected sigmoid scores); set it to true")


def _mtp_and_numbers(cfg: Config) -> None:
    m, t, mtp, o = cfg.model, cfg.training, cfg.mtp, cfg.optimizer
    for i, (start, lam) in enumerate(mtp.loss_weight_schedule):
        if start < 0 or lam < 0:
            raise UserError(f"mtp.loss_weight_schedule[{i}] = {[start, lam]} must have tokens >= 0 and λ >= 0")
    if mtp.num_layers and not mtp.loss_weight_schedule:
        raise UserError("mtp.loss_weight_schedule is empty; give at least [[0, λ]] when mtp.num_layers > 0")
    if t.seq_length > m.max_position_embeddings:
        raise UserError(f"training.seq_length={t.seq_length} exceeds model.max_position_embeddings="
                        f"{m.max_position_embeddings}; shorten the sequences or raise max_position_embeddings")
    if t.fp8 is not None and t.precision != "bf16":
        raise UserError(f"training.fp8={t.fp8} needs training.precision=bf16")
    if t.fp8_param_gather and t.fp8 is None:
        raise UserError("training.fp8_param_gather needs training.fp8 (an FP8 recipe)")
    if t.bf16_first_last_layers is not None:
        pair = t.bf16_first_last_layers
        per_stage = m.num_layers // cfg.parallel.pipeline
        if len(pair) != 2 or not all(isinstance(n, int) and 0 <= n <= per_stage for n in pair):
            raise UserError(f"training.bf16_first_last_layers is {pair}; give [START, END], each 0 to {per_stage} (the "
                            "decoder layers of one pipeline stage)")
        if t.fp8 in (None, "delayed"):
            raise UserError(f"training.bf16_first_last_layers needs a training.fp8 recipe other than delayed (it is "
                            f"{t.fp8}); megatron-core keeps no layer in bf16 under delayed scaling")
    if t.grad_reduce_dtype == "bf16" and t.precision != "bf16":
        raise UserError("training.grad_reduce_dtype=bf16 needs training.precision=bf16")
    for key, value in (("optimizer.adam_eps", o.adam_eps), ("model.norm_epsilon", m.norm_epsilon),
                       ("model.init_method_std", m.init_method_std)):
        if not value > 0:
            raise UserError(f"{key} is {value}; it must be a positive number")
    for key, value in (("optimizer.lr", o.lr), ("optimizer.min_lr", o.min_lr),
                       ("optimizer.weight_decay", o.weight_decay),
                       ("optimizer.clip_grad", o.clip_grad), ("model.aux_loss_coeff", m.aux_loss_coeff),
                       ("model.router_bias_update_rate", m.router_bias_update_rate)):
        if value < 0:
            raise UserError(f"{key} is {value}; it must be 0 or more")
    if o.min_lr > o.lr:
        raise UserError(f"optimizer.min_lr={o.min_lr} exceeds optimizer.lr={o.lr}")
    for key, value in (("optimizer.adam_beta1", o.adam_beta1), ("optimizer.adam_beta2", o.adam_beta2)):
        if not 0 <= value < 1:
            raise UserError(f"{key} is {value}; it must be in [0, 1)")
    if t.manual_gc_interval < 0:
        raise UserError(f"training.manual_gc_interval is {t.manual_gc_interval}; use 0 (off) or a step interval")
    if t.max_skipped_steps < 1:
        raise UserError(f"training.max_skipped_steps is {t.max_skipped_steps}; it must be at least 1")
    spike = t.loss_spike
    if spike.factor is not None and not spike.factor > 1:
        raise UserError(f"training.loss_spike.factor is {spike.factor}; it must be above 1 (or null to turn "
                        "the rule off)")
    if spike.window < 2 or spike.patience < 1 or spike.max_rollbacks < 0:
        raise UserError("training.loss_spike needs window >= 2, patience >= 1 and max_rollbacks >= 0")


def _mtp_style(cfg: Config) -> None:
    """Options that only some MTP styles have (their traits), then the run's style's own checks."""
    mtp = cfg.mtp
    style = get_style(mtp.style)
    if mtp.repeated_layer and (mtp.num_layers == 0 or not style.chains_modules):
        raise UserError("mtp.repeated_layer applies one sequential MTP module at every depth and needs "
                        f"mtp.num_layers > 0 and mtp.style={style_names('chains_modules')}; set those or drop "
                        "mtp.repeated_layer")
    if mtp.head_by_head_backward and not style.head_by_head:
        raise UserError(f"mtp.head_by_head_backward needs mtp.style={style_names('head_by_head')} (sequential "
                        "modules chain their hidden states, so their losses cannot be back-propagated one at a time)")
    if mtp.targets != "tokens" and (mtp.num_layers == 0 or not style.soft_targets):
        raise UserError(f"mtp.targets={mtp.targets} needs sequential MTP modules or an assistant (mtp.num_layers > 0, "
                        f"mtp.style={style_names('soft_targets')}); set mtp.targets=tokens")
    if mtp.targets != "tokens" and cfg.parallel.moe_a2a_overlap:
        raise UserError(f"mtp.targets={mtp.targets} needs parallel.moe_a2a_overlap=false (megatron-core's overlapped "
                        "schedule computes the MTP losses in its own nodes, to the data tokens only)")
    if not 0.0 <= mtp.self_weight <= 1.0 or not mtp.self_temperature > 0:
        raise UserError(f"mtp.self_weight ({mtp.self_weight}) must be within 0..1 and mtp.self_temperature "
                        f"({mtp.self_temperature}) above 0")
    if mtp.freeze_base:
        why = ("mtp.num_layers > 0" if mtp.num_layers == 0
               else "mtp.head_by_head_backward=false (the trainer back-propagates the heads itself)"
               if mtp.head_by_head_backward
               else "a model to start from (checkpoint.load)" if not cfg.checkpoint.load
               else "parallel.moe_a2a_overlap=false (no base backward to overlap)" if cfg.parallel.moe_a2a_overlap
               else None)
        if why:
            raise UserError(f"mtp.freeze_base trains only the MTP modules of an existing model and needs {why}; "
                            "set it or drop mtp.freeze_base")
    if mtp.num_layers:
        style.check(cfg)
    if mtp.num_layers and not style.a2a_overlap and cfg.parallel.moe_a2a_overlap:
        raise UserError(f"parallel.moe_a2a_overlap needs mtp.style={style_names('a2a_overlap')} (megatron-core's "
                        "overlapped "
                        "schedule plan builds only the sequential MTP block)")


def _recompute(cfg: Config, sizes: ParallelSizes) -> None:
    r = cfg.recompute
    if r.granularity == "selective":
        unknown = [name for name in r.modules if name not in RECOMPUTE_MODULES]
        if unknown or not r.modules:
            raise UserError(f"recompute.modules {r.modules} must list some of {', '.join(RECOMPUTE_MODULES)}")
        theirs = [name for name in r.modules if name in FAMILY_RECOMPUTE_MODULES and
                  name not in cfg.model.RECOMPUTE_MODULES]
        if theirs:
            raise UserError(f"recompute.modules {theirs[0]} recomputes {FAMILY_RECOMPUTE_MODULES[theirs[0]]}, which "
                            f"model.family={cfg.model.family} does not have; remove it")
        if "moe_act" in r.modules and cfg.kernels.grouped_gemm is False:
            raise UserError("recompute.modules moe_act needs the experts' grouped GEMM; remove moe_act or set "
                            "kernels.grouped_gemm to auto/true (GPU with Transformer Engine)")
    if r.granularity == "full":
        per_stage = math.ceil(cfg.model.num_layers / (sizes.pp * sizes.vpp))
        if not 1 <= r.num_layers <= max(per_stage, 1):
            raise UserError(f"recompute.num_layers is {r.num_layers}; with full recompute it must be between 1 and "
                            f"the decoder layers per pipeline chunk ({per_stage})")
        chained = cfg.mtp.num_layers and get_style(cfg.mtp.style).chains_modules
        if chained and r.method == "uniform" and r.num_layers != 1:
            raise UserError("full recompute with method=uniform recomputes MTP layers one at a time; set "
                            "recompute.num_layers=1 (or method=block, which leaves MTP layers as they are)")


def _overlap(cfg: Config, sizes: ParallelSizes) -> None:
    p, t = cfg.parallel, cfg.training
    if p.overlap_param_gather and not (p.distributed_optimizer and p.overlap_grad_reduce):
        raise UserError("parallel.overlap_param_gather needs parallel.distributed_optimizer=true and "
                        "parallel.overlap_grad_reduce=true")
    if p.moe_a2a_overlap:
        why = None
        if t.precision == "fp32":
            why = "training.precision bf16 or fp16"
        elif p.expert == 1:
            why = "parallel.expert > 1"
        elif p.token_dispatcher == "allgather":
            why = "parallel.token_dispatcher alltoall or flex"
        elif cfg.recompute.granularity == "full":
            why = "recompute.granularity other than full"
        elif cfg.mtp.num_layers > 1:
            why = "mtp.num_layers at most 1"
        elif cfg.mtp.num_layers and p.pipeline == 1:
            why = "parallel.pipeline > 1 when MTP is on"
        elif p.pipeline > 1 and sizes.vpp == 1:
            why = "parallel.virtual_pipeline > 1 when parallel.pipeline > 1"
        if why:
            raise UserError(f"parallel.moe_a2a_overlap needs {why} (megatron-core's overlap_moe_expert_parallel_comm)")
    if p.delay_wgrad_compute and not p.moe_a2a_overlap:
        raise UserError("parallel.delay_wgrad_compute needs parallel.moe_a2a_overlap=true")


def _family_overlap(cfg: Config) -> None:
    """A family whose layer megatron-core's overlapped MoE schedule would not compute (ModelConfig.NO_A2A_OVERLAP)."""
    why = cfg.model.NO_A2A_OVERLAP
    if cfg.parallel.moe_a2a_overlap and why:
        raise UserError(f"parallel.moe_a2a_overlap does not work with model.family={cfg.model.family}: {why}; set "
                        "parallel.moe_a2a_overlap=false")


def _optimizer(cfg: Config) -> None:
    o, p, t = cfg.optimizer, cfg.parallel, cfg.training
    if not 0.0 <= o.offload_fraction <= 1.0:
        raise UserError(f"optimizer.offload_fraction is {o.offload_fraction}; it must be between 0 and 1")
    offload = o.offload_fraction > 0
    if offload:
        if t.precision == "fp32":
            raise UserError("optimizer.offload_fraction > 0 needs training.precision bf16 or fp16 (megatron-core's "
                            "offload optimizer cannot hold fp32 parameter shards)")
        if not o.precision_aware:
            raise UserError("optimizer.offload_fraction > 0 needs optimizer.precision_aware=true (megatron-core "
                            "offloads through its precision-aware optimizer)")
    if o.precision_aware and not p.distributed_optimizer:
        raise UserError("optimizer.precision_aware needs parallel.distributed_optimizer=true")
    if o.moment_dtype != "fp32":
        if not o.precision_aware:
            raise UserError(f"optimizer.moment_dtype={o.moment_dtype} needs optimizer.precision_aware=true")
        if offload:
            raise UserError(f"optimizer.moment_dtype={o.moment_dtype} does not apply with optimizer.offload_fraction "
                            "> 0 (megatron-core's offload optimizer keeps fp32 moments); use fp32 or no offload")
    if o.offload_overlap and not offload:
        raise UserError("optimizer.offload_overlap needs optimizer.offload_fraction > 0")
    if o.cpu_optimizer != "torch" and not offload:
        raise UserError(f"optimizer.cpu_optimizer={o.cpu_optimizer} needs optimizer.offload_fraction > 0")
    if t.fp8_param_gather and not p.distributed_optimizer:
        raise UserError("training.fp8_param_gather needs parallel.distributed_optimizer=true")


def _positive(cfg: Config, keys: list[str]) -> None:
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value <= 0:
            raise UserError(f"{key} is {value}; it must be a positive integer")
