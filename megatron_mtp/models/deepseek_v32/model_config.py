"""DeepSeek-V3.2's own model fields: the MLA families' (models/mla/model_config.py: MLA, YaRN) and the
lightning indexer of DeepSeek Sparse Attention (``model.family=deepseek_v32`` builds this class)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from megatron_mtp.errors import UserError
from megatron_mtp.models.mla.model_config import MLAModelConfig
from megatron_mtp.models.mla.model_config import check as check_mla


@dataclass
class DeepseekV32ModelConfig(MLAModelConfig):
    MTP_STYLES: ClassVar[tuple[str, ...]] = ("sequential",)
    RECOMPUTE_MODULES: ClassVar[tuple[str, ...]] = ()

    index_n_heads: int = 64
    """Indexer heads (HF index_n_heads): each scores every earlier token with a ReLU'd dot product."""
    index_head_dim: int = 128
    """Width of one indexer head (HF index_head_dim); its first qk_pos_emb_head_dim dimensions are rotated."""
    index_topk: int = 2048
    """Earlier tokens the main attention reads per query (HF index_topk): the indexer's best-scoring ones."""
    indexer_loss_coeff: float = 0.0
    """Weight of megatron-core's indexer KL loss (the indexer's scores towards the main attention's
    distribution, logged as train/indexer_loss); 0 (megatron-core's default): the loss is not computed and the
    indexer does not learn at all, since its top-k selection passes no gradient (set it when training)."""

    def check(self, cfg: Any) -> None:
        check(cfg)


def check(cfg) -> None:
    """One sentence for the first field the model, or the installed megatron-core, cannot take."""
    from megatron_mtp.platform.megatron_core import require_dsa

    check_mla(cfg)
    m = cfg.model
    if m.q_lora_rank is None:
        raise UserError("model.q_lora_rank is null; DeepSeek-V3.2's indexer reads the query latent, so set it")
    for name in ("index_n_heads", "index_head_dim", "index_topk"):
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} is {getattr(m, name)}; it must be positive")
    if m.index_head_dim < m.qk_pos_emb_head_dim:
        raise UserError(f"model.index_head_dim ({m.index_head_dim}) is below model.qk_pos_emb_head_dim "
                        f"({m.qk_pos_emb_head_dim}), the indexer's rotated part; raise it")
    if m.indexer_loss_coeff < 0:
        raise UserError(f"model.indexer_loss_coeff is {m.indexer_loss_coeff}; it must be 0 or more")
    if cfg.parallel.tensor > 1 or cfg.parallel.context > 1:
        raise UserError("DeepSeek-V3.2 is built for parallel.tensor 1 and parallel.context 1 so far (its indexer's "
                        "key norm has no sequence-parallel form here); set both to 1")
    require_dsa("DeepSeek-V3.2")
