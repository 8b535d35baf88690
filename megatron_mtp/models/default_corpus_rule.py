"""Which models may train on the embedded default corpus (data.paths null).

The default corpus (the Python standard library, about 2 M tokens with its own 4,096-token BPE) is
for trying the tiny recipes on a fresh machine. A model above DEFAULT_CORPUS_MAX_PARAMS with
data.paths unset is a recipe whose data was forgotten: `train` and `submit` refuse it in one
sentence, `plan` plans it with the same sentence as a note. Setting data.tokenizer (the default
corpus tokenised with the model's own tokenizer, e.g. to try an imported model) is a deliberate
choice and is allowed at any size.
"""

from __future__ import annotations

from typing import Optional

from megatron_mtp.config import Config

DEFAULT_CORPUS_MAX_PARAMS = 100_000_000
"""The largest model (total parameters, MTP modules included) the default corpus may train
unasked: fifty times the tiny recipes, far below any real recipe."""


def default_corpus_refusal(cfg: Config) -> Optional[str]:
    """The sentence that refuses this config's data, or None when it may train."""
    if cfg.data.paths is not None or cfg.data.tokenizer is not None:
        return None
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.models.family import get_family

    vocab = cfg.model.vocab_size or cfg.data.default_corpus_vocab_size
    counts = get_family(cfg.model.family).parameter_counts(cfg, padded_vocab_size(vocab, cfg))
    total = counts.get("main", 0) + counts.get("mtp_unique", 0)
    if total <= DEFAULT_CORPUS_MAX_PARAMS:
        return None
    return (f"data.paths is not set, so this {total / 1e9:.1f}B-parameter model would train on the embedded "
            "default corpus (the Python standard library, about 2 M tokens), which is for trying the tiny "
            "recipes; set data.paths to your preprocessed corpus (`megatron-mtp preprocess`), or set "
            "data.tokenizer to try the model on the default corpus with its own tokenizer")
