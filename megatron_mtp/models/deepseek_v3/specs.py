"""megatron-core ModuleSpecs for the DeepSeek-V3 decoder block and its MTP block.

With Transformer Engine we use megatron-core's TE specs unchanged. Without it we start from
megatron-core's local specs and swap in two platform modules (see platform/local_modules.py):
an RMSNorm that supports sequence parallelism and an MLA-aware core attention.
"""

from __future__ import annotations

import dataclasses

from megatron_mtp.platform import Platform


def _swap_local_modules(spec):
    """Return a copy of a spec tree with megatron's local norm/attention replaced by ours."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.spec_utils import ModuleSpec
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    from megatron_mtp.platform.local_modules import CoreAttention, RMSNorm

    swap = {WrappedTorchNorm: RMSNorm, DotProductAttention: CoreAttention}
    try:
        from megatron.core.fusions.fused_layer_norm import FusedLayerNorm

        swap[FusedLayerNorm] = RMSNorm
    except ImportError:
        pass

    def walk(node):
        if isinstance(node, type) and node in swap:
            return swap[node]
        if isinstance(node, ModuleSpec):
            return dataclasses.replace(
                node,
                module=swap.get(node.module, node.module),
                submodules=walk(node.submodules) if node.submodules is not None else None,
            )
        if isinstance(node, list):
            return [walk(n) for n in node]
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return dataclasses.replace(
                node, **{f.name: walk(getattr(node, f.name)) for f in dataclasses.fields(node)}
            )
        return node

    return walk(spec)


def decoder_block_spec(config, platform: Platform, vp_stage=None, pp_rank=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=platform.use_te, normalization="RMSNorm",
        vp_stage=vp_stage, pp_rank=pp_rank,
    )
    return spec if platform.use_te else _swap_local_modules(spec)


def mtp_block_spec(config, block_spec, platform: Platform, vp_stage=None, pp_rank=None):
    """MTP block for this pipeline stage (None on stages without MTP layers)."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    spec = get_gpt_mtp_block_spec(
        config, block_spec, use_transformer_engine=platform.use_te, vp_stage=vp_stage, pp_rank=pp_rank
    )
    if spec is None or platform.use_te:
        return spec
    return _swap_local_modules(spec)
