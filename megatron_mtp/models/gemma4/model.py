"""Build the megatron-core GPTModel of one Gemma 4 pipeline stage (models/megatron_model.py) from the
family's own layer specs (models/gemma4/specs.py), with Gemma's two changes at the model's ends:
the word embedding's output times sqrt(hidden) (in the embedding's dtype, as transformers rounds it) and
the output layer's logits soft-capped, c·tanh(z / c). Both are done by giving the stage's embedding and
output layer a subclass of their own class, so every path through them (the main loss, the MTP depths'
embeddings and logits, the metrics' hook on the output layer) sees Gemma's values."""

from __future__ import annotations

import torch

from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import FamilyParts
from megatron_mtp.models.gemma4.hf_config_json import embedding_multiplier
from megatron_mtp.models.gemma4.model_config import MTP_KIND
from megatron_mtp.models.gemma4.specs import block_spec, layer_spec, mtp_spec
from megatron_mtp.models.megatron_model import build_gpt_model
from megatron_mtp.platform import Platform


class _ScaledEmbedding:
    embedding_scale: float = 1.0

    def forward(self, *args, **kwargs):
        out = super().forward(*args, **kwargs)
        return out * torch.tensor(self.embedding_scale, dtype=out.dtype, device=out.device)


class _SoftcappedOutput:
    softcap: float = 30.0

    def forward(self, *args, **kwargs):
        logits, bias = super().forward(*args, **kwargs)
        return self.softcap * torch.tanh(logits / self.softcap), bias


def _extend(module, mixin: type, **attrs) -> None:
    module.__class__ = type(f"{mixin.__name__.strip('_')}{type(module).__name__}", (mixin, type(module)), {})
    for key, value in attrs.items():
        setattr(module, key, value)


def _drafter_model() -> type:
    from megatron_mtp.models.gemma4.assistant.model import AssistantGPTModel

    return AssistantGPTModel


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; `config` is the TransformerConfig."""
    from megatron_mtp.platform.features import resolve_features

    features = resolve_features(cfg, platform)
    parts = FamilyParts(lambda: layer_spec(cfg, platform, MTP_KIND, features.grouped_gemm), _drafter_model)
    # the style's model in place of megatron-core's MTP block, or the block with the family's MTP spec
    specs = (block_spec(cfg, config, platform, features, vp_stage),
             lambda: mtp_spec(cfg, config, platform, features, vp_stage))
    model = build_gpt_model(cfg, config, platform, vocab_size, pre_process, post_process, vp_stage, keys_as_te={},
                            position_embedding_type="none", specs=specs, parts=parts)
    if getattr(model, "embedding", None) is not None:
        _extend(model.embedding, _ScaledEmbedding, embedding_scale=embedding_multiplier(cfg.model.hidden_size))
    if post_process and cfg.model.final_logit_softcapping is not None:
        _extend(model.output_layer, _SoftcappedOutput, softcap=float(cfg.model.final_logit_softcapping))
    return model
