"""Which kernels and GPU-only controls a run uses on this platform.

Every `auto` in the config resolves here: on where the platform has what the control needs, off
elsewhere (so `auto` is always off on CPU). An explicit `true` (or a setting that can only run
with a GPU and Transformer Engine) on a platform without it is one sentence naming the field and
what to do. The result is recorded in the checkpoint's config through the resolved values the
trainer uses, and the mapping onto megatron-core reads nothing else.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.errors import UserError
from megatron_mtp.platform.detect import Platform


@dataclass(frozen=True)
class Features:
    grouped_gemm: bool
    permute_fusion: bool
    router_fusion: bool
    cross_entropy_fusion: Optional[str]
    """None, 'native' or 'te'."""
    output_loss_chunk: Optional[int]
    """Tokens per chunk of the chunked output-layer loss; None: the whole logits."""
    rope_fusion: bool
    gradient_accumulation_fusion: bool
    fp8_padding: bool
    tp_comm_overlap: bool
    async_save: bool
    data_workers: int
    """data.num_workers resolved: reading processes per rank."""
    cuda_graph: Optional[str]
    """megatron-core's cuda_graph_impl ('local' or 'transformer_engine'); None: no CUDA graphs."""
    shared_expert_overlap: bool


def _needs(platform: Platform, field: str, what: str, te: bool = True, fix: str = "set it to auto or false") -> None:
    if platform.is_cpu:
        raise UserError(f"{field}=true needs {what} on a GPU, but this run is on CPU; {fix}")
    if te and not platform.use_te:
        raise UserError(f"{field}=true needs Transformer Engine, which is not installed here; install the 'gpu' "
                        f"extra (pip install 'megatron-mtp[gpu]') or {fix}")


def _toggle(value, available: bool, platform: Platform, field: str, what: str, te: bool = True) -> bool:
    if value == "auto":
        return available
    if value is True and not available:
        _needs(platform, field, what, te)
        raise UserError(f"{field}=true is not available here ({what}); set it to auto or false")
    return bool(value)


def has_module(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def resolve_features(cfg, platform: Platform) -> Features:
    """The controls this run uses on `platform` (UserError for ones it cannot have)."""
    k, p, t, o = cfg.kernels, cfg.parallel, cfg.training, cfg.optimizer
    gpu_te = not platform.is_cpu and platform.use_te
    if cfg.data.reset_attention_mask and platform.use_te:
        raise UserError("data.reset_attention_mask=true needs megatron-core's local attention, but this run "
                        "uses Transformer Engine's, which takes document boundaries only as packed sequences; "
                        "set it to false (data.eod_mask_loss still keeps each loss within its document)")
    yarn = getattr(cfg.model, "yarn", None) is not None and cfg.model.yarn.factor != 1.0  # MLA's YaRN
    moe = cfg.model.num_experts > 0
    fused_ce = _cross_entropy(k.cross_entropy_fusion, platform)
    chunk = _output_loss_chunk(cfg, fused_ce)
    features = Features(
        grouped_gemm=_toggle(k.grouped_gemm, gpu_te and moe, platform, "kernels.grouped_gemm",
                             "Transformer Engine's grouped GEMM"),
        permute_fusion=_toggle(k.permute_fusion, gpu_te and moe, platform, "kernels.permute_fusion",
                               "Transformer Engine >= 2.1"),
        router_fusion=_toggle(k.router_fusion, gpu_te and moe, platform, "kernels.router_fusion",
                              "Transformer Engine >= 2.6"),
        cross_entropy_fusion=None if chunk else fused_ce,  # the chunked loss takes its place
        output_loss_chunk=chunk,
        rope_fusion=_toggle(k.rope_fusion, not platform.is_cpu and yarn, platform, "kernels.rope_fusion",
                            "the Triton MLA YaRN RoPE kernel (and YaRN rotary settings)", te=False),
        gradient_accumulation_fusion=_toggle(k.gradient_accumulation_fusion, gpu_te, platform,
                                             "kernels.gradient_accumulation_fusion",
                                             "Transformer Engine or apex fused weight-gradient kernels"),
        fp8_padding=_toggle(k.fp8_padding, t.fp8 is not None and moe, platform, "kernels.fp8_padding",
                            "training.fp8 (padding only matters for FP8 GEMMs)"),
        tp_comm_overlap=_toggle(p.tp_comm_overlap, gpu_te and p.tensor > 1, platform, "parallel.tp_comm_overlap",
                                "Transformer Engine userbuffers and parallel.tensor > 1"),
        # available everywhere, but `auto` is off on CPU: there the training step itself uses every core,
        # so a background writer takes its time from the step (tools/bench/bench_checkpoint.py measures
        # 2x the time lost per save of a synchronous one)
        async_save=(not platform.is_cpu) if cfg.checkpoint.async_save == "auto" else bool(cfg.checkpoint.async_save),
        # null: worker processes on a GPU, where the step leaves the cores idle; none on CPU, where the step
        # itself uses every core (tools/bench/bench_data_loading.py measures both)
        data_workers=(0 if platform.is_cpu else 2) if cfg.data.num_workers is None else cfg.data.num_workers,
        cuda_graph=_cuda_graph(cfg, platform),
        shared_expert_overlap=_shared_expert_overlap(cfg, platform),
    )
    if features.data_workers < 0 or cfg.data.prefetch < 1:
        raise UserError(f"data.num_workers is {cfg.data.num_workers} and data.prefetch {cfg.data.prefetch}; give "
                        "0 or more workers and a prefetch of at least 1")
    here = "this run is on CPU" if platform.is_cpu else "it is not available here"
    if cfg.recompute.granularity == "selective" and "moe_act" in cfg.recompute.modules and not features.grouped_gemm:
        raise UserError("recompute.modules moe_act needs the experts' grouped GEMM (GPU with Transformer Engine), but "
                        f"{here}; remove moe_act from recompute.modules")
    if p.token_dispatcher == "flex":
        module = {"deepep": "deep_ep", "hybridep": "deep_ep"}[p.flex_backend]
        if platform.is_cpu or not has_module(module):
            what = "this run is on CPU" if platform.is_cpu else f"the {module} package is not installed"
            raise UserError(f"parallel.token_dispatcher=flex with flex_backend={p.flex_backend} needs a GPU with the "
                            f"{p.flex_backend} package, but {what}; use token_dispatcher=alltoall")
    if p.delay_wgrad_compute and not gpu_te:
        _needs(platform, "parallel.delay_wgrad_compute", "Transformer Engine linear layers", fix="set it to false")
    if o.precision_aware and o.offload_fraction == 0 and not gpu_te:
        _needs(platform, "optimizer.precision_aware", "Transformer Engine's FusedAdam",
               fix="set it to false, or offload optimizer state (optimizer.offload_fraction > 0)")
    if o.cpu_optimizer == "deepspeed" and not has_module("deepspeed"):
        raise UserError("optimizer.cpu_optimizer=deepspeed needs DeepSpeed; install the 'deepspeed' extra "
                        "(pip install 'megatron-mtp[deepspeed]') or use cpu_optimizer=torch")
    return features


CUDA_GRAPH_SCOPES = {"transformer_engine": ("attn", "mlp", "moe", "moe_router", "moe_preprocess"),
                     "local": ("attn", "mlp", "moe", "moe_router", "moe_preprocess", "full_iteration")}
"""What kernels.cuda_graph_scope may name per implementation (megatron-core's CudaGraphScope)."""


def _cuda_graph(cfg, platform: Platform) -> Optional[str]:
    k, m = cfg.kernels, cfg.model
    if k.cuda_graph == "off":
        if k.cuda_graph_scope is not None:
            raise UserError("kernels.cuda_graph_scope is set but kernels.cuda_graph is off; set kernels.cuda_graph "
                            "to local or transformer_engine, or leave the scope null")
        return None
    if platform.is_cpu:
        raise UserError(f"kernels.cuda_graph={k.cuda_graph} needs CUDA graphs on a GPU, but this run is on CPU; "
                        "set kernels.cuda_graph=off")
    if k.cuda_graph == "transformer_engine" and not platform.use_te:
        raise UserError("kernels.cuda_graph=transformer_engine needs Transformer Engine, which is not installed here; "
                        "install the 'gpu' extra (pip install 'megatron-mtp[gpu]') or use kernels.cuda_graph=local")
    scope = k.cuda_graph_scope or []
    unknown = [s for s in scope if s not in CUDA_GRAPH_SCOPES[k.cuda_graph]]
    if unknown:
        raise UserError(f"kernels.cuda_graph_scope names {unknown[0]!r}, which kernels.cuda_graph={k.cuda_graph} "
                        f"cannot capture; use any of {', '.join(CUDA_GRAPH_SCOPES[k.cuda_graph])}")
    if "moe" in scope and not m.moe_pad_to_capacity:
        raise UserError("kernels.cuda_graph_scope moe needs fixed expert shapes: set model.moe_capacity_factor and "
                        "model.moe_pad_to_capacity=true, or capture moe_router/moe_preprocess instead")
    return k.cuda_graph


def _shared_expert_overlap(cfg, platform: Platform) -> bool:
    m, p, r = cfg.model, cfg.parallel, cfg.recompute
    recomputed = r.granularity == "selective" and "shared_experts" in r.modules
    why = ("model.num_shared_experts=0" if not (m.num_experts and m.num_shared_experts) else
           f"parallel.token_dispatcher={p.token_dispatcher} (only alltoall)" if p.token_dispatcher != "alltoall" else
           "parallel.moe_a2a_overlap, which overlaps the shared experts itself" if p.moe_a2a_overlap else
           "recompute.modules shared_experts" if recomputed else None)
    if p.shared_expert_overlap == "auto":
        return not platform.is_cpu and why is None
    if p.shared_expert_overlap and platform.is_cpu:
        raise UserError("parallel.shared_expert_overlap=true needs CUDA streams on a GPU, but this run is on CPU; "
                        "set it to auto or false")
    if p.shared_expert_overlap and why is not None:
        raise UserError(f"parallel.shared_expert_overlap=true does not work with {why}; set it to auto or false")
    return bool(p.shared_expert_overlap)


def _output_loss_chunk(cfg, fused_ce: Optional[str]) -> Optional[int]:
    k = cfg.kernels
    if k.output_loss_chunk < 1:
        raise UserError(f"kernels.output_loss_chunk is {k.output_loss_chunk}; give the tokens per chunk of the "
                        "chunked output loss, at least 1")
    softcap = getattr(cfg.model, "final_logit_softcapping", None)  # the chunks compute z = h Wᵀ uncapped
    if softcap is not None and k.chunked_output_loss is True:
        raise UserError("kernels.chunked_output_loss=true does not soft-cap logits, which "
                        f"model.final_logit_softcapping={softcap} asks for; set it to auto or false")
    if softcap is not None:
        return None
    if k.chunked_output_loss == "auto":
        tokens = cfg.training.seq_length * cfg.training.micro_batch_size
        return k.output_loss_chunk if fused_ce is None and tokens > k.output_loss_chunk else None
    if k.chunked_output_loss and k.cross_entropy_fusion in ("te", "native"):
        raise UserError(f"kernels.chunked_output_loss=true and kernels.cross_entropy_fusion={k.cross_entropy_fusion} "
                        "both replace the output layer's cross entropy; set one of them to auto or off")
    return k.output_loss_chunk if k.chunked_output_loss else None


def _cross_entropy(value: str, platform: Platform) -> Optional[str]:
    if value == "auto":
        return "te" if not platform.is_cpu and platform.use_te else None
    if value == "off":
        return None
    if value == "te" and (platform.is_cpu or not platform.use_te):
        _needs(platform, "kernels.cross_entropy_fusion", "Transformer Engine's fused cross entropy")
    return value
