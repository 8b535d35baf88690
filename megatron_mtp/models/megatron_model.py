"""The megatron-core GPTModel of one pipeline stage, for any family: the family gives its attention's
local -> TE checkpoint renames and its position embedding (models/megatron_specs.py), and the run's MTP style
(config/mtp_style.py) what replaces megatron-core's MTP block, if anything."""

from __future__ import annotations

from typing import Any, Callable, Optional, Union

from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import FamilyParts, get_style
from megatron_mtp.models.megatron_specs import KeysAsTe, decoder_block_spec, mtp_block_spec, parallel_head_layer_spec
from megatron_mtp.models.tensor_table import mtp_is_moe
from megatron_mtp.platform import Platform


def build_gpt_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                    post_process: bool, vp_stage=None, *, keys_as_te: KeysAsTe, position_embedding_type: str,
                    rotary_percent: float = 1.0, parts: Optional[FamilyParts] = None,
                    specs: Optional[tuple[Any, Union[Any, Callable[[], Any]]]] = None):
    """GPTModel for the current pipeline stage; `config` is the family's TransformerConfig. The MTP style's
    ``wrap`` gives the model class (and its extra arguments) that replaces the MTP block, if any, from `parts`
    (what the family gives its styles; by default its MTP layer as mtp_block_spec builds it). `specs`: the
    family's own (decoder block, MTP block) specs, where megatron-core's GPT specs do not build it (the MTP
    block's may be a function, called only where the block stays). With
    mtp.targets other than tokens, mtp.freeze_base, data.eod_mask_loss, parallel.context > 1 or the chunked
    output loss, the
    sequential MTP block trains through models/mtp_objective.py."""
    from megatron.core.models.gpt import GPTModel

    from megatron_mtp.platform.features import resolve_features

    chunk = resolve_features(cfg, platform).output_loss_chunk
    block = specs[0] if specs else decoder_block_spec(config, platform, keys_as_te, vp_stage=vp_stage)
    if parts is None:
        parts = FamilyParts(lambda: parallel_head_layer_spec(config, platform, keys_as_te, mtp_is_moe(cfg.model)))
    style_model = get_style(cfg.mtp.style).wrap(cfg, platform, parts) if cfg.mtp.num_layers else None
    if style_model is not None:
        model_class, mtp = style_model[0], None
        extra = dict(style_model[1], head_norm_spec=block.layer_norm, output_chunk=chunk,
                     stop_at_documents=cfg.data.eod_mask_loss)
    else:
        model_class, extra = GPTModel, {}
        mtp = (specs[1]() if callable(specs[1]) else specs[1]) if specs else mtp_block_spec(
            config, platform, keys_as_te, vp_stage=vp_stage, moe=mtp_is_moe(cfg.model))
        if chunk or (cfg.mtp.num_layers and (cfg.mtp.targets != "tokens" or cfg.mtp.freeze_base
                                             or cfg.data.eod_mask_loss or cfg.parallel.context > 1)):
            from megatron_mtp.models.mtp_objective import MTPObjectiveGPTModel

            model_class = MTPObjectiveGPTModel
            extra = dict(targets=cfg.mtp.targets, self_weight=cfg.mtp.self_weight,
                         self_temperature=cfg.mtp.self_temperature, freeze_base=cfg.mtp.freeze_base,
                         output_chunk=chunk, stop_at_documents=cfg.data.eod_mask_loss)
    model = model_class(
        config=config,
        transformer_layer_spec=block,
        vocab_size=vocab_size,
        max_sequence_length=cfg.training.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=cfg.model.tie_embeddings,
        position_embedding_type=position_embedding_type,
        rotary_percent=rotary_percent,
        rotary_base=int(cfg.model.rope_theta),
        mtp_block_spec=mtp,
        vp_stage=vp_stage,
        **extra,
    )
    if (cfg.model.tie_embeddings and post_process and not pre_process and getattr(model, "mtp_process", False)
            and getattr(model.output_layer, "weight", None) is not None):
        # megatron-core allocates the last stage's output weight, then reads the tied weight from the MTP
        # stage's embedding copy and checkpoints that copy alone: the allocated one would be an orphan parameter
        # (no gradient, and a key its tied checkpointing asserts away)
        model.output_layer.weight = None
    return model
