"""The megatron-core GPTModel of one pipeline stage with DeepSeek Sparse Attention (every DSA family's).

Design note. megatron-core 0.19 builds DSA as an ``AbsorbedMLASelfAttention`` whose core attention is
``DSAttention`` with its ``DSAIndexer`` (get_dsa_module_spec_for_backend); its own block builder
(experimental_attention_variant_module_specs) accepts only Transformer Engine, so the layers are put
together here: each layer of megatron-core's MLA GPT specs (dense or MoE by the model's rule) with
its self-attention replaced by the DSA spec of the same backend. On the local backend the usual swaps
apply (models/megatron_specs.py: our RMSNorm and core attention), except the indexer's key norm,
which is a LayerNorm with a bias and stays torch's (``IndexerKeyNorm``: megatron-core's WrappedTorchNorm
refuses sequence parallelism, but the indexer gathers the sequence over TP before the norm, so it is not
sequence-parallel here). The indexer's projections are megatron-core's local duplicated ``Linear``, whole
on every tensor rank (DSAIndexer marks its weights for a TP-average of their gradients); ``IndexerLinear``
gives their checkpoint entries a replica id per tensor rank, which the class itself leaves 0. DSA keeps the
q/kv latent norms apart from the up-projections under TE too (the indexer
reads the normed query latent), so the checkpoint keys need no TE renames for the attention. The MTP
layers are built from a DSA layer of the kind the engines build (models/megatron_specs.py), so each
MTP layer has its own indexer, as the releases' MTP layers do. With IndexShare (GLM-5) DSAttention
itself leaves the indexer out of a layer that reuses an earlier top-k (models/dsa/model_config.py says
which); a pipeline stage must start on a layer with its own (megatron-core's check, and the family's in
one sentence before). On the CPU path DSAttention runs its unfused PyTorch attention and indexer loss
(``dsa_kernel_backend`` "none").
"""

from __future__ import annotations

import copy
import dataclasses

from megatron_mtp.config import Config
from megatron_mtp.models.dsa.stages import freeze_for_stage
from megatron_mtp.models.megatron_model import build_gpt_model
from megatron_mtp.models.megatron_specs import swap_local_modules
from megatron_mtp.models.tensor_table import mtp_is_moe
from megatron_mtp.platform import Platform

DSA_KEYS_AS_TE: dict[str, str] = {}
"""DSA's attention has the same keys in both specs (its latent norms are never fused)."""


class IndexerKeyNorm:
    """The indexer's key norm on the local backend: torch's LayerNorm with a bias. It normalises the keys of the
    whole sequence (the indexer gathers its input over the tensor ranks first), so unlike megatron-core's
    WrappedTorchNorm it is built under sequence parallelism too; DSAIndexer marks its weights
    ``average_gradients_across_tp_domain``, so their replicated gradients are averaged over TP."""

    def __new__(cls, config, hidden_size: int, eps: float = 1e-5):
        import torch

        return torch.nn.LayerNorm(hidden_size, eps=eps)


def _keep_indexer_layernorm(node):
    """A spec tree whose DSA indexer key norm is torch's LayerNorm again (after the local swaps)."""
    from megatron.core.transformer.experimental_attention_variant.dsa import DSAIndexerSubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(node, DSAIndexerSubmodules):
        return dataclasses.replace(node, k_norm=IndexerKeyNorm)
    if isinstance(node, ModuleSpec):
        return dataclasses.replace(node, submodules=_keep_indexer_layernorm(node.submodules)
                                   if node.submodules is not None else None)
    if isinstance(node, list):
        return [_keep_indexer_layernorm(n) for n in node]
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return dataclasses.replace(node, **{f.name: _keep_indexer_layernorm(getattr(node, f.name))
                                            for f in dataclasses.fields(node)})
    return node


def indexer_linear() -> type:
    """megatron-core's local duplicated ``Linear`` (the indexer's projections, whole on every tensor rank) whose
    checkpoint entries are replicas over TP: the class itself gives every TP rank replica id 0, so two ranks
    would write the same tensor (megatron-core's sharding validation refuses it)."""
    from megatron.core import parallel_state
    from megatron.core.post_training.modelopt.layers import Linear
    from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

    class IndexerLinear(Linear):
        def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
            return make_sharded_tensors_for_checkpoint(
                self.state_dict(prefix="", keep_vars=True), prefix, sharded_offsets=sharded_offsets,
                tp_group=parallel_state.get_tensor_model_parallel_group(), dp_cp_group=metadata["dp_cp_group"])

    return IndexerLinear


def _local_dsa_attention(config, local_provider, dsa_spec):
    """megatron-core's DSA attention spec on the local backend, which names no plain linear: the indexer's
    projections are megatron-core's local duplicated ``Linear`` (it takes ``parallel_mode``), the MLA
    down-projections the ColumnParallelLinear the absorbed attention accepts without TE."""
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear

    class _Local(local_provider):
        def linear(self):
            return indexer_linear()

    spec = dsa_spec(config, _Local())
    sub = dataclasses.replace(spec.submodules, linear_q_down_proj=ColumnParallelLinear,
                              linear_kv_down_proj=ColumnParallelLinear)
    return dataclasses.replace(spec, submodules=sub)


def dsa_layer_specs(config, platform: Platform) -> list:
    """One TransformerLayer spec per decoder layer of the whole model: MLA GPT layers with DSA."""
    from megatron.core.models.backends import LocalSpecProvider
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import get_dsa_module_spec_for_backend
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_layer_specs

    plain = copy.copy(config)
    plain.experimental_attention_variant = None  # the GPT builders refuse the variant; the attention is set below
    layers = get_gpt_decoder_layer_specs(plain, platform.use_te, "RMSNorm")
    if platform.use_te:
        from megatron.core.extensions.transformer_engine_spec_provider import TESpecProvider

        attention = get_dsa_module_spec_for_backend(config, TESpecProvider())
    else:
        attention = _local_dsa_attention(config, LocalSpecProvider, get_dsa_module_spec_for_backend)
    out = []
    for layer in layers:
        spec = dataclasses.replace(layer, submodules=dataclasses.replace(layer.submodules, self_attention=attention))
        out.append(spec if platform.use_te else _keep_indexer_layernorm(swap_local_modules(spec, DSA_KEYS_AS_TE)))
    return out


def _block_spec(config, platform: Platform, layers: list, vp_stage):
    from megatron.core.models.gpt.experimental_attention_variant_module_specs import (
        _validate_dsa_index_share_pipeline_split,
    )
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
        get_transformer_layer_offset,
    )

    from megatron_mtp.platform.local_modules import RMSNorm

    if config.pipeline_model_parallel_layout is not None:
        ids = config.pipeline_model_parallel_layout.get_layer_id_list(layer_type=LayerType.decoder, vp_stage=vp_stage)
    else:
        offset = get_transformer_layer_offset(config, vp_stage=vp_stage)
        ids = range(offset, offset + get_num_layers_to_build(config, vp_stage=vp_stage))
    _validate_dsa_index_share_pipeline_split(config, ids)
    if platform.use_te:
        from megatron.core.extensions.transformer_engine import TENorm

        norm = TENorm
    else:
        norm = RMSNorm
    return TransformerBlockSubmodules(layer_specs=[layers[i] for i in ids], layer_norm=norm)


def _mtp_block_spec(config, platform: Platform, layers: list, moe: bool, vp_stage):
    """The MTP block from a DSA layer of the kind the engines build (models/megatron_specs.py's rule)."""
    if not config.mtp_num_layers:
        return None
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_mtp_block_spec

    pattern = config.moe_layer_freq if isinstance(config.moe_layer_freq, list) else None
    layer = layers[-1]
    if config.num_moe_experts and pattern is not None:
        layer = next((s for s, m in zip(reversed(layers), reversed(pattern)) if bool(m) == moe), None)
        if layer is None:
            uniform = dataclasses.replace(config, moe_layer_freq=[int(moe)] * config.num_layers)
            layer = dsa_layer_specs(uniform, platform)[-1]
    spec = get_gpt_mtp_block_spec(config, layer, use_transformer_engine=platform.use_te, vp_stage=vp_stage)
    if spec is None or platform.use_te:
        return spec
    return _keep_indexer_layernorm(swap_local_modules(spec, DSA_KEYS_AS_TE))


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; ``config`` is the MLATransformerConfig with DSA."""
    layers = dsa_layer_specs(config, platform)
    specs = (_block_spec(config, platform, layers, vp_stage),
             _mtp_block_spec(config, platform, layers, mtp_is_moe(cfg.model), vp_stage))
    model = build_gpt_model(cfg, config, platform, vocab_size, pre_process, post_process, vp_stage,
                            keys_as_te=DSA_KEYS_AS_TE, specs=specs,
                            position_embedding_type="none")  # MLA and the indexer apply their own rotary embedding
    freeze_for_stage(model, cfg.model)  # the warm-up trains the indexers alone (models/dsa/stages.py)
    return model
