"""megatron-core ModuleSpecs of Gemma 4's decoder layers (one per layer kind), of a pipeline stage's
block, and of its MTP block.

A layer is megatron-core's TransformerLayer with Gemma 4's attention (models/gemma4/attention.py, its
post-attention norm inside) and feed-forward block (models/gemma4/feed_forward.py, its norms inside); the
layer's pre-MLP norm is an identity. ``Gemma4Layer`` adds the one thing TransformerLayer has no place
for: the per-layer output multiplier ``layer_scalar`` (a buffer, 1 unless a checkpoint says otherwise).
The block lists each layer's spec by kind, and a stage takes its layers' specs the way megatron-core's
own block spec does (the pipeline layout's layer ids, else the stage's offset and count). The same
checkpoint names serve the local and the Transformer Engine modules: no norm is fused into a linear.
"""

from __future__ import annotations

import functools

from megatron_mtp.config import Config
from megatron_mtp.models.gemma4.model_config import (
    MTP_KIND,
    SLIDING,
    SLIDING_CP_COMM,
    kind_groups,
    kind_head_dim,
    kind_rope,
    kind_shares_kv,
)
from megatron_mtp.platform import Platform


@functools.cache
def gemma4_layer_class():
    """The one Gemma4Layer class (defined when megatron-core is first needed)."""
    import torch
    from megatron.core.transformer.transformer_layer import TransformerLayer

    class Gemma4Layer(TransformerLayer):
        """TransformerLayer whose output is multiplied by ``layer_scalar`` (module note)."""

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.register_buffer("layer_scalar", torch.ones(1, dtype=self.config.params_dtype))

        def forward(self, *args, **kwargs):
            output, context = super().forward(*args, **kwargs)
            return output * self.layer_scalar.to(output.dtype), context

    return Gemma4Layer


def _modules(platform: Platform):
    """(norm, column linear, row linear, core attention) of this platform."""
    if platform.use_te:
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TEDotProductAttention,
            TENorm,
            TERowParallelLinear,
        )

        return TENorm, TEColumnParallelLinear, TERowParallelLinear, TEDotProductAttention
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear

    from megatron_mtp.platform.local_modules import CoreAttention, RMSNorm

    return RMSNorm, ColumnParallelLinear, RowParallelLinear, CoreAttention


def layer_spec(cfg: Config, platform: Platform, kind: str, grouped_gemm: bool = False):
    """The spec of one decoder layer of ``kind`` (sliding_attention or full_attention)."""
    from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
    from megatron.core.transformer.enums import AttnMaskType
    from megatron.core.transformer.identity_op import IdentityOp
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.transformer_layer import TransformerLayerSubmodules

    from megatron_mtp.models.gemma4.attention import Gemma4Attention, Gemma4AttentionSubmodules
    from megatron_mtp.models.gemma4.feed_forward import FeedForwardBuilder, Gemma4FeedForwardSubmodules, moe_submodules

    m = cfg.model
    norm, column, row, core = _modules(platform)
    base, share = kind_rope(m, kind)
    attention = ModuleSpec(
        module=Gemma4Attention,
        params=dict(head_dim=kind_head_dim(m, kind), query_groups=kind_groups(m, kind),
                    shares_kv=kind_shares_kv(m, kind), rope_base=base, rope_share=share,
                    window=m.sliding_window if kind == SLIDING else None, attn_mask_type=AttnMaskType.causal,
                    core_cp_comm=SLIDING_CP_COMM if kind == SLIDING and cfg.parallel.context > 1 else None),
        submodules=Gemma4AttentionSubmodules(linear_q=column, linear_k=column, linear_v=column, linear_proj=row,
                                             core_attention=core, q_layernorm=norm, k_layernorm=norm,
                                             post_layernorm=norm))
    moe = moe_submodules(platform.use_te, m.num_experts, grouped_gemm) if m.num_experts else None
    ffn = FeedForwardBuilder(Gemma4FeedForwardSubmodules(norm=norm, dense=MLPSubmodules(linear_fc1=column,
                                                                                         linear_fc2=row), moe=moe))
    return ModuleSpec(module=gemma4_layer_class(), submodules=TransformerLayerSubmodules(
        input_layernorm=norm, self_attention=attention, self_attn_bda=get_bias_dropout_add,
        pre_mlp_layernorm=IdentityOp, mlp=ffn, mlp_bda=get_bias_dropout_add))


def stage_layer_specs(config, specs: list, vp_stage=None, pp_rank=None) -> list:
    """The specs of the layers this pipeline stage (and virtual stage) builds."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build
    from megatron.core.transformer.transformer_layer import get_transformer_layer_offset

    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        ids = layout.get_layer_id_list(layer_type=LayerType.decoder, vp_stage=vp_stage, pp_rank=pp_rank)
        return [specs[i] for i in ids]
    count = get_num_layers_to_build(config, vp_stage=vp_stage, pp_rank=pp_rank)
    offset = get_transformer_layer_offset(config, vp_stage=vp_stage, pp_rank=pp_rank)
    return specs[offset:offset + count]


def block_spec(cfg: Config, config, platform: Platform, features, vp_stage=None):
    """The decoder block of this pipeline stage: each of its layers by kind, then the final norm."""
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    kinds = cfg.model.layer_kinds()
    by_kind = {k: layer_spec(cfg, platform, k, features.grouped_gemm) for k in set(kinds)}
    specs = stage_layer_specs(config, [by_kind[k] for k in kinds], vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=specs, layer_norm=_modules(platform)[0])


def mtp_spec(cfg: Config, config, platform: Platform, features, vp_stage=None):
    """The MTP block of this stage (None without MTP layers on it): megatron-core's, around a Gemma 4 layer
    of the MTP kind, with the local norms swapped in on CPU (models/megatron_specs.py)."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec
    from megatron.core.transformer.transformer_block import TransformerBlockSubmodules

    from megatron_mtp.models.megatron_specs import swap_local_modules

    # megatron-core takes a block's last layer, or a ModuleSpec of exactly TransformerLayer
    layer = TransformerBlockSubmodules(layer_specs=[layer_spec(cfg, platform, MTP_KIND, features.grouped_gemm)],
                                       layer_norm=_modules(platform)[0])
    spec = get_gpt_mtp_block_spec(config, layer, use_transformer_engine=platform.use_te, vp_stage=vp_stage)
    return spec if spec is None or platform.use_te else swap_local_modules(spec, {})
