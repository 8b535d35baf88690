"""The model's vocabulary as allocated: padded rows, the size a null model.vocab_size takes, and the check
that a tokenizer fits in them."""

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


def resolve_vocab(cfg: Config) -> int:
    """The model's padded vocabulary (a null model.vocab_size takes the tokenizer's)."""
    vocab = cfg.model.vocab_size
    if vocab is None:
        if cfg.data.tokenizer:
            vocab = _tokenizer_vocab(cfg.data.tokenizer)
        elif not cfg.data.paths:
            vocab = cfg.data.default_corpus_vocab_size
        else:
            raise UserError("model.vocab_size is null and data.tokenizer is not set, so the plan cannot size the "
                            "embedding; set model.vocab_size or data.tokenizer")
    return padded_vocab_size(vocab, cfg)


def _tokenizer_vocab(path: str) -> int:
    import json
    import os

    file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
    try:
        with open(file, encoding="utf-8") as fh:
            data = json.load(fh)
        ids = set(data["model"]["vocab"].values()) | {t["id"] for t in data.get("added_tokens", [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        raise UserError(f"data.tokenizer '{path}' is not a readable tokenizer.json; set model.vocab_size so the plan "
                        "can size the embedding") from None
    return max(ids) + 1
