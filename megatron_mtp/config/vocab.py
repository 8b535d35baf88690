"""The model's vocabulary as allocated: padded rows, and the check that a tokenizer fits in them."""

from __future__ import annotations

from megatron_mtp.config.root import Config
from megatron_mtp.errors import UserError


def padded_vocab_size(vocab_size: int, cfg: Config) -> int:
    """Rows of the embedding and output layer: vocab rounded up to a multiple of
    model.make_vocab_size_divisible_by × parallel.tensor (megatron convention)."""
    multiple = max(1, cfg.model.make_vocab_size_divisible_by) * max(1, cfg.parallel.tensor)
    return -(-vocab_size // multiple) * multiple


def check_tokenizer_fits(cfg: Config, tokenizer_vocab: int, tokenizer_name: str) -> None:
    """A tokenizer's ids must all have a row in the model's (padded) embedding."""
    if cfg.model.vocab_size is None:
        return
    padded = padded_vocab_size(cfg.model.vocab_size, cfg)
    if tokenizer_vocab > padded:
        raise UserError(
            f"tokenizer '{tokenizer_name}' has {tokenizer_vocab} tokens but the model's padded vocabulary is "
            f"{padded} (model.vocab_size={cfg.model.vocab_size}); raise model.vocab_size to at least "
            f"{tokenizer_vocab} or set it to null"
        )
