"""Training data: indexed-dataset blends, splits, tokenizer, and the embedded default corpus."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass
class DataConfig:
    paths: Optional[list[str]] = None
    """Indexed-dataset prefixes (PREFIX.bin/PREFIX.idx) to train on; an entry may be a glob over
    prefixes (`data/fineweb_shard-*`) or a text file listing prefixes one per line, each optionally
    preceded by its weight (Megatron-LM's `WEIGHT PREFIX` pairs). Null uses the embedded default
    corpus (the Python standard library's source), allowed only for models no larger than the tiny
    recipes' unless data.tokenizer is set."""
    weights: Optional[list[float]] = None
    """Blend weights, one per entry of `paths`, normalised to sum to 1; an entry naming several
    datasets shares its weight among them by their list-file weights or sizes (null: the list files'
    weights, or else in proportion to each dataset's size)."""
    allow_changed_paths: bool = False
    """Resume even when `paths`/`valid_paths` now resolve to other datasets than the checkpoint's run
    read (a glob that matches more or fewer shards, an edited list file, other paths): every
    checkpoint records the resolved prefixes, and by default such a resume is refused in one sentence,
    because another blend reads every later sample in another order."""
    valid_paths: Optional[list[str]] = None
    """Separate validation prefixes; null carves validation out of `paths` with `split`."""
    valid_weights: Optional[list[float]] = None
    """Blend weights, one per entry of `valid_paths` (null: in proportion to size)."""
    split: str = "98,2,0"
    """Train/valid/test percentages applied to each prefix of `paths` (when valid_paths is null)."""
    tokenizer: Optional[str] = None
    """A Hugging Face `tokenizers` tokenizer.json or a directory holding one; null with the default
    corpus uses the default corpus's tokenizer."""
    cache_dir: Optional[str] = None
    """Where the default corpus is built and megatron-core caches dataset indices (under
    `indices/`); null: $MEGATRON_MTP_CACHE or ~/.cache/megatron_mtp. Multi-node jobs need a
    directory every node sees."""
    default_corpus_vocab_size: int = 4096
    """Vocabulary size of the default corpus's byte-level BPE tokenizer."""
    default_corpus_max_bytes: int = 8_000_000
    """Cap on the standard-library source the default corpus takes (bytes; keeps the first build
    to seconds). Changing it builds a new corpus in the cache."""
    eod_mask_loss: bool = False
    """Document boundaries for the loss: no prediction whose target lies in the next document (the
    main model's at each EOD, megatron-core's `eod_mask_loss`; each MTP depth's wherever an EOD lies
    between its position and its target)."""
    reset_attention_mask: bool = False
    """Document boundaries for attention: a token attends only to its own document (megatron-core's
    `reset_attention_mask`, a materialised [s, s] mask per sample; megatron-core's local attention
    only, so not with Transformer Engine)."""
    reset_position_ids: bool = False
    """Positions restart at each document (megatron-core's `reset_position_ids`). megatron-core's
    rotary embeddings take positions from the sequence length, not position_ids, so with the rotary
    families here it would change nothing: refused with a sentence."""
    num_workers: Optional[int] = None
    """Worker processes per rank that read and collate micro-batches ahead of the step (a torch
    DataLoader); 0 reads in the training process; null: 2 on a GPU, 0 on CPU. Only the ranks of the
    first and last pipeline stages read (training/batches.py)."""
    prefetch: int = 2
    """Micro-batches each data worker keeps ready (DataLoader's prefetch_factor)."""
