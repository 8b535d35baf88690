"""Config checks that run before any process group starts. Each failure is one sentence naming the field."""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config.root import Config
from megatron_mtp.errors import UserError


def validate(cfg: Config, world_size: Optional[int] = None) -> None:
    """Raise UserError for the first inconsistency found (world_size: processes actually launched)."""
    m, p, t, mtp = cfg.model, cfg.parallel, cfg.training, cfg.mtp
    _positive(cfg, ["model.num_layers", "model.hidden_size", "model.num_attention_heads", "parallel.tensor",
                    "parallel.pipeline", "parallel.expert", "training.max_steps", "training.seq_length",
                    "training.micro_batch_size", "training.global_batch_size"])
    if mtp.num_layers < 0:
        raise UserError(f"mtp.num_layers is {mtp.num_layers}; it must be 0 (no MTP) or a positive depth")
    if world_size is None:
        world_size = p.world_size or p.tensor * p.pipeline * p.expert
    if p.world_size is not None and p.world_size != world_size:
        raise UserError(f"parallel.world_size is {p.world_size} but {world_size} processes were launched; "
                        "launch that many processes or change parallel.world_size")
    model_parallel = p.tensor * p.pipeline
    if world_size % model_parallel:
        raise UserError(f"world size {world_size} is not divisible by parallel.tensor × parallel.pipeline = "
                        f"{p.tensor}×{p.pipeline}; change the parallel sizes or the number of processes")
    dp = world_size // model_parallel
    if dp % p.expert:
        raise UserError(f"parallel.expert={p.expert} must divide the data-parallel size {dp} "
                        f"(world {world_size} / (tensor {p.tensor} × pipeline {p.pipeline}))")
    if p.expert > 1 and m.num_experts == 0:
        raise UserError("parallel.expert > 1 needs a MoE model; set model.num_experts > 0 or parallel.expert=1")
    if m.num_experts and m.num_experts % p.expert:
        raise UserError(f"model.num_experts={m.num_experts} is not divisible by parallel.expert={p.expert}; "
                        "every expert-parallel rank must hold the same number of experts")
    sp = p.sequence_parallel if p.sequence_parallel is not None else p.tensor > 1
    if m.num_experts and p.tensor > 1 and not sp:
        raise UserError("parallel.sequence_parallel is false but MoE with parallel.tensor > 1 needs sequence "
                        "parallelism; set parallel.sequence_parallel=true (or null)")
    if sp and p.tensor == 1:
        raise UserError("parallel.sequence_parallel=true needs parallel.tensor > 1")
    if sp and t.seq_length % p.tensor:
        raise UserError(f"training.seq_length={t.seq_length} must be divisible by parallel.tensor={p.tensor} "
                        "with sequence parallelism")
    for name, value in (("model.num_attention_heads", m.num_attention_heads),):
        if value % p.tensor:
            raise UserError(f"{name}={value} is not divisible by parallel.tensor={p.tensor}")
    if p.pipeline_layout is not None:
        if len(p.pipeline_layout) != p.pipeline:
            raise UserError(f"parallel.pipeline_layout has {len(p.pipeline_layout)} stages but parallel.pipeline "
                            f"is {p.pipeline}; give one layer count per stage")
        if sum(p.pipeline_layout) != m.num_layers or min(p.pipeline_layout) < 0:
            raise UserError(f"parallel.pipeline_layout {p.pipeline_layout} must be non-negative counts summing to "
                            f"model.num_layers={m.num_layers} (MTP layers are added to the last stage)")
    elif m.num_layers % p.pipeline:
        raise UserError(f"model.num_layers={m.num_layers} cannot be split evenly over parallel.pipeline={p.pipeline} "
                        "stages (MTP layers sit on the last stage in addition); change the sizes or set "
                        "parallel.pipeline_layout")
    per_step = t.micro_batch_size * dp
    if t.global_batch_size % per_step:
        raise UserError(f"training.global_batch_size={t.global_batch_size} must be a multiple of "
                        f"micro_batch_size × data-parallel size = {t.micro_batch_size}×{dp}={per_step}")
    if m.num_experts:
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
    if mtp.num_layers and m.num_layers - (p.pipeline_layout[-1] if p.pipeline_layout else 0) < 0:
        raise UserError("the last pipeline stage must exist to hold the MTP layers")
    for i, entry in enumerate(mtp.loss_weight_schedule):
        start, lam = entry
        if start < 0 or lam < 0:
            raise UserError(f"mtp.loss_weight_schedule[{i}] = {list(entry)} must have tokens >= 0 and λ >= 0")
    if mtp.num_layers and not mtp.loss_weight_schedule:
        raise UserError("mtp.loss_weight_schedule is empty; give at least [[0, λ]] when mtp.num_layers > 0")
    if m.q_lora_rank is not None and m.q_lora_rank <= 0:
        raise UserError("model.q_lora_rank must be positive or null")
    if t.fp8 is not None and t.precision != "bf16":
        raise UserError(f"training.fp8={t.fp8} needs training.precision=bf16")


def _positive(cfg: Config, keys: list[str]) -> None:
    for key in keys:
        section, name = key.split(".")
        value = getattr(getattr(cfg, section), name)
        if value <= 0:
            raise UserError(f"{key} is {value}; it must be a positive integer")
