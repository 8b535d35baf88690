"""Build the megatron-core GPTModel for one pipeline stage."""

from __future__ import annotations

from megatron_mtp.config import Config
from megatron_mtp.models.deepseek_v3.specs import decoder_block_spec, mtp_block_spec, parallel_head_layer_spec
from megatron_mtp.platform import Platform


def build_model(cfg: Config, config, platform: Platform, vocab_size: int, pre_process: bool,
                post_process: bool, vp_stage=None):
    """GPTModel for the current pipeline stage; `config` is the MLATransformerConfig."""
    from megatron.core.models.gpt import GPTModel

    block = decoder_block_spec(config, platform, vp_stage=vp_stage)
    model_class, extra = GPTModel, {}
    if cfg.mtp.style == "parallel" and cfg.mtp.num_layers:  # Gloeckle-style heads instead of the MTP block
        from megatron_mtp.models.deepseek_v3.parallel_heads import ParallelHeadsGPTModel

        model_class, mtp = ParallelHeadsGPTModel, None
        extra = dict(head_layer_spec=parallel_head_layer_spec(config, platform),
                     head_norm_spec=block.layer_norm,  # each head ends with a norm like the decoder's final one
                     head_by_head_backward=cfg.mtp.head_by_head_backward)
    else:
        mtp = mtp_block_spec(config, platform, vp_stage=vp_stage)
        if cfg.mtp.num_layers and (cfg.mtp.targets != "tokens" or cfg.mtp.freeze_base):
            from megatron_mtp.models.deepseek_v3.mtp_objective import MTPObjectiveGPTModel

            model_class = MTPObjectiveGPTModel
            extra = dict(targets=cfg.mtp.targets, self_weight=cfg.mtp.self_weight,
                         self_temperature=cfg.mtp.self_temperature, freeze_base=cfg.mtp.freeze_base)
    return model_class(
        config=config,
        transformer_layer_spec=block,
        vocab_size=vocab_size,
        max_sequence_length=cfg.training.seq_length,
        pre_process=pre_process,
        post_process=post_process,
        parallel_output=True,
        share_embeddings_and_output_weights=cfg.model.tie_embeddings,
        position_embedding_type="none",  # MLA applies its own (YaRN) rotary embedding
        rotary_base=int(cfg.model.rope_theta),
        mtp_block_spec=mtp,
        vp_stage=vp_stage,
        **extra,
    )
