"""GLM-5's own model fields: the DSA families' (models/dsa/model_fields.py: MLA, YaRN, the lightning indexer)
with GLM-5's indexer (32 heads, interleaved RoPE) and IndexShare: a layer may reuse the top-k of the last layer
that ran its indexer (transformers' ``indexer_types``; ``model.family=glm_moe_dsa`` builds this class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from megatron_mtp.config import pipeline_layout
from megatron_mtp.errors import UserError
from megatron_mtp.models.dsa.model_fields import DSAModelConfig
from megatron_mtp.models.dsa.model_fields import check as check_dsa


@dataclass
class GlmMoeDsaModelConfig(DSAModelConfig):
    TITLE: ClassVar[str] = "GLM-5"
    INDEXER_ROPE_INTERLEAVED: ClassVar[bool] = True  # transformers' GlmMoeDsaIndexer rotates interleaved pairs

    index_n_heads: int = 32
    """Indexer heads (HF index_n_heads): each scores every earlier token with a ReLU'd dot product."""
    index_topk_freq: int = 1
    """IndexShare (HF index_topk_freq): past the first index_skip_topk_offset layers, one layer in this many
    runs its own indexer and the others reuse its top-k; 1: every layer runs its own."""
    index_skip_topk_offset: int = 2
    """IndexShare (HF index_skip_topk_offset): how many first layers all run their own indexer (at least 1);
    the last of them starts the every-index_topk_freq pattern."""

    def index_share(self) -> tuple[int, int]:
        return self.index_topk_freq, self.index_skip_topk_offset

    def indexer_types(self) -> list[str]:
        """transformers' ``indexer_types``: "full" where a decoder layer runs its own indexer, else "shared"."""
        return ["full" if self.runs_indexer(i + 1) else "shared" for i in range(self.num_layers)]

    def check(self, cfg: Any) -> None:
        check(cfg)


def check(cfg) -> None:
    """One sentence for the first field the model, its layout or the installed megatron-core cannot take."""
    m, p = cfg.model, cfg.parallel
    if m.index_topk_freq < 1:
        raise UserError(f"model.index_topk_freq is {m.index_topk_freq}; it must be 1 (every layer runs its own "
                        "indexer) or more")
    if m.index_skip_topk_offset < 1:
        raise UserError(f"model.index_skip_topk_offset is {m.index_skip_topk_offset}; it must be 1 or more, since "
                        "the first layer has no earlier top-k to reuse")
    check_dsa(cfg)
    if m.index_topk_freq > 1 and p.pipeline > 1:
        for stage in pipeline_layout.stages(m.num_layers, cfg.mtp.num_layers, p.pipeline, p.virtual_pipeline,
                                            p.pipeline_layout):
            if stage.layers and not m.runs_indexer(stage.layers[0] + 1):
                raise UserError(f"pipeline rank {stage.pp_rank} starts on decoder layer {stage.layers[0]}, which "
                                "reuses an earlier layer's top-k (model.index_topk_freq "
                                f"{m.index_topk_freq}); give parallel.pipeline_layout stages that start on a layer "
                                "that runs its own indexer")
