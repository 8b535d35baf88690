"""The model fields of DeepSeek Sparse Attention's lightning indexer (over MLA's, models/mla/model_config.py),
which the DSA families share, which layers run their own indexer, and their checks.

Which layers run the indexer. Every layer does in DeepSeek-V3.2; GLM-5's IndexShare lets a layer reuse the
top-k of the last layer that ran one (transformers' ``indexer_types`` "full"/"shared"). megatron-core numbers
the layers from 1 (decoder layer i is i + 1; the MTP layers number their own, depth d is d + 1) and gives a
layer its own indexer unless ``is_dsa_skip_topk_layer(number, offset, freq)``: with a frequency above 1, every
layer up to max(offset, 1) runs one, then every freq-th. transformers' rule over 0-based layers (full where
max(i - offset + 1, 0) % freq is 0) is the same one for any offset of 1 or more, so a family keeps the two
numbers (``index_share``) and every consumer asks ``runs_indexer``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal, Optional

from megatron_mtp.config.model import Growth
from megatron_mtp.errors import UserError
from megatron_mtp.models.dsa.stages import GROWTH, check_stage, is_indexer
from megatron_mtp.models.mla.model_config import MLAModelConfig
from megatron_mtp.models.mla.model_config import check as check_mla


def runs_own_indexer(number: int, freq: int, offset: int) -> bool:
    """Whether the layer megatron-core numbers ``number`` (1-based) runs its own indexer under IndexShare's
    ``dsa_indexer_topk_freq`` ``freq`` and ``dsa_indexer_skip_topk_offset`` ``offset`` (module note)."""
    return freq <= 1 or max(number - max(offset, 1), 0) % freq == 0


@dataclass
class DSAModelConfig(MLAModelConfig):
    """The indexer's fields; a family's class sets its defaults and names (``TITLE``, its RoPE)."""

    MTP_STYLES: ClassVar[tuple[str, ...]] = ("sequential",)
    RECOMPUTE_MODULES: ClassVar[tuple[str, ...]] = ()
    TITLE: ClassVar[str] = "DeepSeek Sparse Attention"
    """How messages name the model (the family's title)."""
    INDEXER_ROPE_INTERLEAVED: ClassVar[bool] = False
    """The indexer rotates interleaved pairs (GLM-5) rather than halves (DeepSeek-V3.2)."""

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
    dsa_stage: Optional[Literal["warmup", "sparse"]] = None
    """The training stage of the DeepSeek-V3.2 report (models/dsa/stages.py; README.md has the recipe).
    warmup: dense attention (every earlier token) and every weight frozen but the indexers (the MTP layer's
    too), which learn from their KL loss towards the main attention's distribution; sparse: top-k selection
    and every weight trains, the indexer's KL loss over the selected tokens only. null: megatron-core's
    defaults (top-k selection, the KL loss over every earlier token). Needs model.indexer_loss_coeff above 0.
    A new run (checkpoint.load) may change it; a resume may not."""

    TRAINING_FIELDS: ClassVar[tuple[str, ...]] = ("indexer_loss_coeff", "dsa_stage")
    TRAINED_PART_FIELDS: ClassVar[tuple[str, ...]] = ("dsa_stage",)
    GROWS_FROM: ClassVar[tuple[str, ...]] = ()
    """Families whose checkpoints (dense MLA) a checkpoint.load takes into this one, its indexers drawn anew."""

    def trains(self, name: str) -> bool:
        return self.dsa_stage != "warmup" or is_indexer(name)

    def grows_from(self, family: str) -> Optional[Growth]:
        return GROWTH if family in self.GROWS_FROM else None

    def index_share(self) -> tuple[int, int]:
        """megatron-core's (dsa_indexer_topk_freq, dsa_indexer_skip_topk_offset); (1, 0): every layer runs its
        own indexer."""
        return 1, 0

    def runs_indexer(self, number: int) -> bool:
        """Whether the layer megatron-core numbers ``number`` (1-based; module note) runs its own indexer."""
        return runs_own_indexer(number, *self.index_share())

    def indexer_layers(self) -> int:
        """Decoder layers that run their own indexer."""
        return sum(self.runs_indexer(i + 1) for i in range(self.num_layers))

    def check(self, cfg: Any) -> None:
        check(cfg)


def check(cfg) -> None:
    """One sentence for the first field the model, or the installed megatron-core, cannot take."""
    from megatron_mtp.platform.megatron_core import require_dsa

    check_mla(cfg)
    check_stage(cfg)
    m = cfg.model
    title = type(m).TITLE
    if m.q_lora_rank is None:
        raise UserError(f"model.q_lora_rank is null; {title}'s indexer reads the query latent, so set it")
    for name in ("index_n_heads", "index_head_dim", "index_topk"):
        if getattr(m, name) < 1:
            raise UserError(f"model.{name} is {getattr(m, name)}; it must be positive")
    if m.index_head_dim < m.qk_pos_emb_head_dim:
        raise UserError(f"model.index_head_dim ({m.index_head_dim}) is below model.qk_pos_emb_head_dim "
                        f"({m.qk_pos_emb_head_dim}), the indexer's rotated part; raise it")
    if m.indexer_loss_coeff < 0:
        raise UserError(f"model.indexer_loss_coeff is {m.indexer_loss_coeff}; it must be 0 or more")
    if cfg.parallel.tensor > 1 and cfg.parallel.sequence_parallel is False:
        raise UserError(f"parallel.sequence_parallel is false, but {title}'s absorbed attention splits the sequence "
                        "over the tensor ranks (megatron-core's AbsorbedMLA); set parallel.sequence_parallel to "
                        "true or null")
    require_dsa(title)
