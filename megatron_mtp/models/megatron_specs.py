"""megatron-core ModuleSpecs of a decoder block and its MTP block, for any family (its attention
comes from megatron-core's TransformerConfig: MLA or grouped-query).

With Transformer Engine we use megatron-core's TE specs unchanged. Without it we start from
megatron-core's local specs and swap in two platform modules (see platform/local_modules.py):
an RMSNorm that supports sequence parallelism and a core attention that takes MLA's head dims and
grouped-query key/value heads.

Checkpoint names are the same for both. TE fuses some norms into the following linear layer
(`...layer_norm_weight`): MLA's q/kv norms into the up-projections, GQA's input norm into linear_qkv,
a dense layer's pre-MLP norm into fc1. The local layers keep separate norm modules, so their sharded
keys are renamed to the TE spelling (TransformerLayer's `sharded_state_dict_keys_map`, which this
module sets whole: megatron-core's own local GQA map would also rename a MoE layer's pre-MLP norm,
which TE keeps separate). A family names its attention renames (``KeysAsTe``). A checkpoint
written on CPU therefore loads into a TE model and the other way round, and the tensor table needs
one spelling.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Mapping

from megatron_mtp.platform import Platform

KeysAsTe = Mapping[str, str]
"""A family's local -> TE sharded-key prefixes of its attention block, relative to the layer."""


def swap_local_modules(spec, keys_as_te: KeysAsTe):
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

    from megatron.core.transformer.transformer_layer import TransformerLayer

    def walk(node):
        if isinstance(node, type) and node in swap:
            return swap[node]
        if isinstance(node, ModuleSpec):
            node = dataclasses.replace(
                node,
                module=swap.get(node.module, node.module),
                submodules=walk(node.submodules) if node.submodules is not None else None,
            )
            return _with_te_checkpoint_names(node, keys_as_te) if node.module is TransformerLayer else node
        if isinstance(node, functools.partial):  # megatron-core 0.19's builders: partial(MLP.as_mlp_submodule, ...)
            return functools.partial(node.func, *[walk(a) for a in node.args],
                                     **{k: walk(v) for k, v in node.keywords.items()})
        if isinstance(node, list):
            return [walk(n) for n in node]
        if dataclasses.is_dataclass(node) and not isinstance(node, type):
            return dataclasses.replace(
                node, **{f.name: walk(getattr(node, f.name)) for f in dataclasses.fields(node)}
            )
        return node

    return walk(spec)


_DENSE_MLP_KEYS_AS_TE = {"pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_"}


def _with_te_checkpoint_names(layer_spec, keys_as_te: KeysAsTe):
    """A local TransformerLayer spec whose checkpoint keys use TE's fused-norm names."""
    from megatron.core.transformer.mlp import MLP

    from megatron_mtp.platform.megatron_core import spec_module

    sub = layer_spec.submodules
    keys = dict(keys_as_te)
    if spec_module(sub.mlp) is MLP:  # dense layer: TE fuses its pre-MLP norm into fc1
        keys.update(_DENSE_MLP_KEYS_AS_TE)
    return dataclasses.replace(layer_spec, submodules=dataclasses.replace(sub, sharded_state_dict_keys_map=keys))


def decoder_block_spec(config, platform: Platform, keys_as_te: KeysAsTe, vp_stage=None, pp_rank=None):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec

    spec = get_gpt_decoder_block_spec(
        config, use_transformer_engine=platform.use_te, normalization="RMSNorm",
        vp_stage=vp_stage, pp_rank=pp_rank,
    )
    return spec if platform.use_te else swap_local_modules(spec, keys_as_te)


def _layer_spec_of_kind(config, platform: Platform, moe: bool):
    """A decoder-layer spec with a routed MLP or a dense one, as the MTP layers and heads need (the
    model's MoE-layer rule at the index the serving engines build them at: config/moe_layers.py). The
    model's own layer of that kind when it has one, else one built with every layer of that kind."""
    import dataclasses

    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs

    specs = get_gpt_decoder_layer_specs(config, platform.use_te, "RMSNorm")
    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else None
    if not config.num_moe_experts or pattern is None:
        return specs[-1]
    for spec, is_moe in zip(reversed(specs), reversed(pattern)):
        if bool(is_moe) == moe:
            return spec
    uniform = dataclasses.replace(config, moe_layer_freq=[int(moe)] * config.num_layers)
    return get_gpt_decoder_layer_specs(uniform, platform.use_te, "RMSNorm")[-1]


def mtp_block_spec(config, platform: Platform, keys_as_te: KeysAsTe, vp_stage=None, pp_rank=None, moe: bool = True):
    """MTP block for this pipeline stage (None on stages without MTP layers).

    Each MTP layer has a routed MLP or a dense one as the serving engines build it (`moe`: the model's
    MoE-layer rule at that index, tensor_table.mtp_is_moe), so that what trains is what exports.
    megatron-core would take the spec from the stage's own decoder block, which is empty on a last stage
    that holds only MTP and the loss (the DeepSeek-V3 layouts' final "mL" stage), and has no layer of
    the right kind on some, so we take it from the whole model's layers.
    """
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    spec = get_gpt_mtp_block_spec(
        config, _layer_spec_of_kind(config, platform, moe), use_transformer_engine=platform.use_te,
        vp_stage=vp_stage, pp_rank=pp_rank
    )
    if spec is None or platform.use_te:
        return spec
    return swap_local_modules(spec, keys_as_te)


def parallel_head_layer_spec(config, platform: Platform, keys_as_te: KeysAsTe, moe: bool = True):
    """The layer spec of a parallel MTP head (mtp_styles/parallel/model.py): of the kind
    mtp_block_spec builds each sequential MTP layer."""
    layer = _layer_spec_of_kind(config, platform, moe)
    return layer if platform.use_te else swap_local_modules(layer, keys_as_te)
