"""What every family gives megatron-core's TransformerConfig: size, MLP, MoE routing, parallelism,
precision, kernels, recompute and MTP; a family adds its attention fields (mla/: MLA, DeepSeek-V3's, and
DeepSeek-V3.2's with its indexer; gqa/: grouped-query attention, GLM-4.5's and Qwen3-MoE's; Gemma 4's
sliding-layer widths) and picks the config class."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron_mtp.config import Config, pipeline_layout
from megatron_mtp.models.tensor_table import moe_layers
from megatron_mtp.platform import Platform, megatron_core
from megatron_mtp.platform.features import Features


def moe_layer_pattern(cfg: Config) -> list[int]:
    """1 for MoE layers, 0 for dense ones (megatron-core's moe_layer_freq list; tensor_table.moe_layers)."""
    layers = moe_layers(cfg.model)
    return [int(i in layers) for i in range(cfg.model.num_layers)]


def sequence_parallel(cfg: Config) -> bool:
    sp = cfg.parallel.sequence_parallel
    return cfg.parallel.tensor > 1 if sp is None else sp


def megatron_layout(cfg: Config) -> tuple[str | None, int]:
    """(layout string given to megatron-core, chunks per pipeline rank) for the config's placement.

    With more than one pipeline stage the placement is always passed as a string, so that training,
    validation and `plan` all read it from config/pipeline_layout.py."""
    p, m = cfg.parallel, cfg.model
    text, vpp = pipeline_layout.resolve(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                        p.pipeline_layout)
    if text is None and p.pipeline * vpp > 1:
        per = m.num_layers // (p.pipeline * vpp)
        text = pipeline_layout.layout_string([per] * (p.pipeline * vpp), cfg.mtp.num_layers)
    return text, vpp


def _recompute_kwargs(cfg: Config) -> dict:
    r = cfg.recompute
    if r.granularity == "none":
        return {}
    if r.granularity == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(r.modules)}
    return {"recompute_granularity": "full", "recompute_method": r.method, "recompute_num_layers": r.num_layers}


def common_kwargs(cfg: Config, platform: Platform, features: Features, mtp_loss_scale: float = 0.0) -> dict:
    """The TransformerConfig fields of this run every family shares (its attention fields aside)."""
    m, p, t, k = cfg.model, cfg.parallel, cfg.training, cfg.kernels
    bf16, fp16 = t.precision == "bf16", t.precision == "fp16"
    dtype = torch.bfloat16 if bf16 else torch.float16 if fp16 else torch.float32
    moe = m.num_experts > 0
    # Sigmoid scores are always renormalised over the selected experts by megatron-core; softmax
    # scores are renormalised unless pre-softmax (DeepSeek-V2 norm_topk_prob=false).
    pre_softmax = m.router_score_function == "softmax" and not m.router_norm_topk_prob
    kwargs = dict(
        num_layers=m.num_layers,
        hidden_size=m.hidden_size,
        ffn_hidden_size=m.ffn_hidden_size,
        num_attention_heads=m.num_attention_heads,
        normalization="RMSNorm",
        layernorm_epsilon=m.norm_epsilon,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=m.init_method_std,
        # parallelism
        tensor_model_parallel_size=p.tensor,
        pipeline_model_parallel_size=p.pipeline,
        expert_model_parallel_size=p.expert,
        expert_tensor_parallel_size=p.expert_tensor or p.tensor,
        sequence_parallel=sequence_parallel(cfg),
        pipeline_dtype=dtype,
        # after a stage sends its output, keep only its autograd node (as Megatron-LM does): the
        # tensor is freed instead of waiting for that micro-batch's backward. Not on CPU: gloo runs
        # the interleaved schedule's asynchronous sends from its own thread, after the schedule has
        # already swapped the tensor's storage, and the next stage would receive the wrong values.
        deallocate_pipeline_outputs=not platform.is_cpu,
        tp_comm_overlap=features.tp_comm_overlap,
        overlap_moe_expert_parallel_comm=p.moe_a2a_overlap,
        delay_wgrad_compute=p.delay_wgrad_compute,
        # precision: bf16/fp16 parameters are created in that dtype (the optimizer keeps fp32 mains)
        params_dtype=dtype,
        bf16=bf16,
        fp16=fp16,
        # fused kernels (platform/features.py decides what `auto` means here)
        use_cpu_initialization=platform.is_cpu,
        gradient_accumulation_fusion=features.gradient_accumulation_fusion,
        bias_activation_fusion=platform.use_te,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=features.rope_fusion,
        cross_entropy_loss_fusion=features.cross_entropy_fusion is not None,
        cross_entropy_fusion_impl=features.cross_entropy_fusion or "native",
        persist_layer_norm=False,
        deterministic_mode=t.deterministic,
        **_recompute_kwargs(cfg),
        # MTP
        mtp_num_layers=cfg.mtp.num_layers or None,
        mtp_loss_scaling_factor=mtp_loss_scale,
        **megatron_core.transformer_config_extras(cfg.mtp),
    )
    if moe:
        kwargs.update(
            num_moe_experts=m.num_experts,
            moe_layer_freq=moe_layer_pattern(cfg),
            moe_ffn_hidden_size=m.moe_ffn_hidden_size,
            moe_shared_expert_intermediate_size=(
                m.num_shared_experts * m.moe_ffn_hidden_size if m.num_shared_experts else None
            ),
            moe_router_topk=m.router_topk,
            moe_router_num_groups=m.router_num_groups,
            moe_router_group_topk=m.router_group_topk,
            moe_router_score_function=m.router_score_function,
            moe_router_pre_softmax=pre_softmax,
            moe_router_topk_scaling_factor=m.router_topk_scaling_factor,
            moe_router_enable_expert_bias=m.router_enable_expert_bias,
            moe_router_bias_update_rate=m.router_bias_update_rate,
            moe_router_load_balancing_type=m.aux_loss_type if m.aux_loss_coeff > 0 else "none",
            moe_aux_loss_coeff=m.aux_loss_coeff,
            moe_token_dispatcher_type=p.token_dispatcher,
            moe_expert_capacity_factor=m.moe_capacity_factor,
            moe_token_drop_policy=m.moe_token_drop_policy,
            moe_pad_expert_input_to_capacity=m.moe_pad_to_capacity,
            moe_flex_dispatcher_backend=p.flex_backend,
            moe_grouped_gemm=features.grouped_gemm,
            moe_permute_fusion=features.permute_fusion,
            moe_router_fusion=features.router_fusion,
            moe_router_dtype=k.router_dtype,
            moe_router_padding_for_quantization=features.fp8_padding,
        )
    layout, vpp = megatron_layout(cfg)
    if layout is not None:
        kwargs["pipeline_model_parallel_layout"] = layout
    if vpp > 1:
        # With PP2, batched p2p ops pair a rank's sends and receives with one peer in the wrong order
        # and silently swap activations and gradients (Megatron-LM refuses it); overlapped p2p does not.
        kwargs.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if t.fp8 == "nvfp4":  # megatron-core's FP4 fields (its fp8 and fp4 exclude each other)
        kwargs.update(fp4="e2m1", fp4_recipe="nvfp4", fp4_param=t.fp8_param_gather)
    elif t.fp8 is not None:
        kwargs.update(fp8="e4m3" if t.fp8 in ("blockwise", "mxfp8") else "hybrid", fp8_recipe=t.fp8,
                      fp8_param=t.fp8_param_gather)
    if t.bf16_first_last_layers is not None and t.fp8 is not None:
        start, end = t.bf16_first_last_layers
        kwargs.update(first_last_layers_bf16=True, num_layers_at_start_in_bf16=start, num_layers_at_end_in_bf16=end)
    if features.cuda_graph is not None:
        kwargs["cuda_graph_impl"] = features.cuda_graph
        if cfg.kernels.cuda_graph_scope is not None:
            kwargs["cuda_graph_scope"] = list(cfg.kernels.cuda_graph_scope)
    if features.shared_expert_overlap:
        kwargs["moe_shared_expert_overlap"] = True
    if cfg.parallel.context > 1:
        kwargs["context_parallel_size"] = cfg.parallel.context
    return kwargs
