"""Translate our typed Config into megatron-core's MLATransformerConfig."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from megatron_mtp.config import Config
from megatron_mtp.platform import Platform


def moe_layer_pattern(cfg: Config) -> list[int]:
    """1 for MoE layers, 0 for dense ones (the first `first_k_dense`)."""
    m = cfg.model
    if m.num_experts == 0:
        return [0] * m.num_layers
    return [0 if i < m.first_k_dense else 1 for i in range(m.num_layers)]


def pipeline_layout_string(cfg: Config) -> str | None:
    """megatron-core layout string for an uneven split (E: embedding, t: layer, m: MTP, L: loss)."""
    layout = cfg.parallel.pipeline_layout
    if layout is None:
        return None
    stages = []
    for i, n in enumerate(layout):
        parts = (["E"] if i == 0 else []) + ["t"] * n
        if i == len(layout) - 1:
            parts += ["m"] * cfg.mtp.num_layers + ["L"]
        stages.append("".join(parts))
    return "|".join(stages)


def sequence_parallel(cfg: Config) -> bool:
    sp = cfg.parallel.sequence_parallel
    return cfg.parallel.tensor > 1 if sp is None else sp


def build_transformer_config(cfg: Config, platform: Platform, mtp_loss_scale: float = 0.0):
    from megatron.core.transformer.transformer_config import MLATransformerConfig

    m, p, t = cfg.model, cfg.parallel, cfg.training
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
        add_qkv_bias=False,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        init_method_std=m.init_method_std,
        # MLA
        multi_latent_attention=True,
        q_lora_rank=m.q_lora_rank,
        kv_lora_rank=m.kv_lora_rank,
        qk_head_dim=m.qk_head_dim,
        qk_pos_emb_head_dim=m.qk_pos_emb_head_dim,
        v_head_dim=m.v_head_dim,
        qk_layernorm=True,
        rope_type="yarn" if m.yarn.factor != 1.0 else "rope",
        rotary_base=m.rope_theta,
        rotary_scaling_factor=m.yarn.factor,
        original_max_position_embeddings=m.yarn.original_max_position_embeddings,
        beta_fast=m.yarn.beta_fast,
        beta_slow=m.yarn.beta_slow,
        mscale=m.yarn.mscale,
        mscale_all_dim=m.yarn.mscale_all_dim,
        # parallelism
        tensor_model_parallel_size=p.tensor,
        pipeline_model_parallel_size=p.pipeline,
        expert_model_parallel_size=p.expert,
        sequence_parallel=sequence_parallel(cfg),
        pipeline_dtype=dtype,
        # precision
        params_dtype=torch.float32,
        bf16=bf16,
        fp16=fp16,
        # kernels that need apex/TE/CUDA are off on the local path
        use_cpu_initialization=platform.is_cpu,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=platform.use_te,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        persist_layer_norm=False,
        deterministic_mode=t.deterministic,
        # MTP
        mtp_num_layers=cfg.mtp.num_layers or None,
        mtp_loss_scaling_factor=mtp_loss_scale,
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
            moe_router_load_balancing_type="seq_aux_loss" if m.aux_loss_coeff > 0 else "none",
            moe_aux_loss_coeff=m.aux_loss_coeff,
            moe_token_dispatcher_type=p.token_dispatcher,
            moe_grouped_gemm=platform.use_te,
        )
    layout = pipeline_layout_string(cfg)
    if layout is not None:
        kwargs["pipeline_model_parallel_layout"] = layout
    if t.fp8 is not None:
        kwargs.update(fp8="e4m3" if t.fp8 in ("blockwise", "mxfp8") else "hybrid", fp8_recipe=t.fp8)
    return MLATransformerConfig(**kwargs)
