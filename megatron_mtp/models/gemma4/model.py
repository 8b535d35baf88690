"""Build the megatron-core GPTModel of one Gemma 4 pipeline stage (models/megatron_model.py) from the
family's own layer specs (models/gemma4/specs.py), with Gemma's two changes at the model's ends:
the word embedding's output times sqrt(hidden) (in the embedding's dtype, as transformers rounds it) and
the output layer's logits soft-capped, c·tanh(z / c). Both are done by giving the stage's embedding and
output layer a subclass of their own class, so every path through them (the main loss, the MTP depths'
embeddings and logits, the metrics' hook on the output layer) sees Gemma's values."""

from __future__ import annotations

import torch

from megatron_mtp.config import Config
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


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; `config` is the TransformerConfig."""
    from megatron_mtp.platform.features import resolve_features

    features = resolve_features(cfg, platform)
    heads = None
    if cfg.mtp.num_layers and cfg.mtp.style == "assistant":  # a drafter of its own on the frozen target
        from megatron_mtp.models.gemma4.assistant.model import AssistantGPTModel

        heads = (AssistantGPTModel, dict(run_config=cfg, platform=platform, step_weights=cfg.mtp.assistant.step_weights,
                                         targets=cfg.mtp.targets, self_weight=cfg.mtp.self_weight,
                                         self_temperature=cfg.mtp.self_temperature))
        specs = (block_spec(cfg, config, platform, features, vp_stage), None)
    elif cfg.mtp.num_layers and cfg.mtp.style == "parallel":  # Gloeckle-style heads, each a layer of the MTP kind
        from megatron_mtp.models.parallel_heads import ParallelHeadsGPTModel

        heads = (ParallelHeadsGPTModel, dict(head_layer_spec=layer_spec(cfg, platform, MTP_KIND, features.grouped_gemm),
                                             head_by_head_backward=cfg.mtp.head_by_head_backward,
                                             freeze_base=cfg.mtp.freeze_base))
        specs = (block_spec(cfg, config, platform, features, vp_stage), None)
    else:
        specs = (block_spec(cfg, config, platform, features, vp_stage),
                 mtp_spec(cfg, config, platform, features, vp_stage))
    model = build_gpt_model(cfg, config, platform, vocab_size, pre_process, post_process, vp_stage, keys_as_te={},
                            position_embedding_type="none", specs=specs, heads=heads)
    if getattr(model, "embedding", None) is not None:
        _extend(model.embedding, _ScaledEmbedding, embedding_scale=embedding_multiplier(cfg.model.hidden_size))
    if post_process and cfg.model.final_logit_softcapping is not None:
        _extend(model.output_layer, _SoftcappedOutput, softcap=float(cfg.model.final_logit_softcapping))
    return model
