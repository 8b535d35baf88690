"""The trainer's data API: resolve the data of a config, check it, build megatron-core datasets.

Three calls, in this order, on every rank:

1. ``resolve_data(cfg)`` — before or after torch.distributed init. Builds the default corpus when
   ``data.paths`` is null (file-locked: one process builds, the rest wait), loads the tokenizer,
   and returns the train/valid blends as absolute prefixes.
2. ``check_data_config(cfg, resolved)`` — fails fast with one UserError sentence on a missing or
   mismatched .bin/.idx pair, weights that do not match paths, a bad split string, a dataset
   tokenised with another tokenizer, too little data for one sequence, or a tokenizer whose
   vocabulary exceeds the model's padded vocabulary.
3. ``build_datasets(cfg, resolved, train_samples, valid_samples)`` — megatron-core's
   BlendedMegatronDatasetBuilder + GPTDataset, the train set read in reshuffled passes beyond its
   built length (data/passes.py). Indices are cached under
   ``CACHE/indices``; rank 0 builds them first and the other ranks load them (megatron-core's
   barrier), which is why ``is_built_on_rank`` is true everywhere.

Blends: ``data.paths`` + ``data.weights`` form one distribution cut into train/valid/test by
``data.split``; with ``data.valid_paths`` the splits come from separate blends instead
(megatron-core's ``blend_per_split``). The default corpus is the second case, with its
held-out files as the validation blend.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import warnings
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Optional

from megatron_mtp.config.vocab import check_tokenizer_fits
from megatron_mtp.data.default_corpus import DefaultCorpus, default_cache_dir, ensure_default_corpus
from megatron_mtp.data.indexed import IndexInfo, check_indexed_pair, read_meta
from megatron_mtp.data.passes import Passes, passes_note, planned_train_samples
from megatron_mtp.data.tokenizer import Tokenizer, load_tokenizer
from megatron_mtp.errors import UserError

_SPLIT_RE = re.compile(r"^\s*\d+(\.\d*)?(\s*,\s*\d+(\.\d*)?){0,2}\s*$")


@dataclass
class ResolvedData:
    """Concrete data of a run: tokenizer and absolute dataset prefixes."""

    tokenizer_path: str
    """The tokenizer directory or tokenizer.json the data was tokenised with (copy it into checkpoints)."""
    tokenizer: Tokenizer
    train_prefixes: list[str]
    train_weights: Optional[list[float]]
    """None: blend in proportion to each prefix's size."""
    valid_prefixes: Optional[list[str]]
    """None: validation is carved out of the train prefixes by `split`."""
    valid_weights: Optional[list[float]]
    split: Optional[str]
    """Train/valid/test percentages (only when valid_prefixes is None)."""
    index_cache_dir: str
    """Where megatron-core caches its document/sample/shuffle indices."""
    default_corpus: Optional[DefaultCorpus] = None
    """Set when training on the embedded default corpus."""

    @property
    def train_blend(self) -> list[tuple[float, str]]:
        """(weight, prefix) pairs of the train blend (weights default to 1.0 each, i.e. by size)."""
        weights = self.train_weights or [1.0] * len(self.train_prefixes)
        return list(zip(weights, self.train_prefixes))

    @property
    def valid_blend(self) -> Optional[list[tuple[float, str]]]:
        if self.valid_prefixes is None:
            return None
        weights = self.valid_weights or [1.0] * len(self.valid_prefixes)
        return list(zip(weights, self.valid_prefixes))


def _abs(path: str) -> str:
    return os.path.abspath(os.path.expanduser(path))


def resolve_data(cfg: Any) -> ResolvedData:
    """Resolve ``cfg.data`` into a tokenizer and absolute prefixes (builds the default corpus if needed)."""
    data = cfg.data
    cache = default_cache_dir(data.cache_dir)
    indices = os.path.join(cache, "indices")
    if data.paths is None:
        for name in ("weights", "valid_paths", "valid_weights"):
            if getattr(data, name, None) is not None:
                raise UserError(
                    f"data.{name} is set but data.paths is null; the embedded default corpus has its own "
                    f"splits, so set data.paths to your datasets or unset data.{name}"
                )
        own = _abs(data.tokenizer) if data.tokenizer else None
        corpus = ensure_default_corpus(cache, data.default_corpus_vocab_size, data.default_corpus_max_bytes,
                                       tokenizer=own)
        return ResolvedData(
            tokenizer_path=corpus.tokenizer_dir,
            tokenizer=load_tokenizer(corpus.tokenizer_dir),
            train_prefixes=[corpus.train_prefix],
            train_weights=None,
            valid_prefixes=[corpus.valid_prefix],
            valid_weights=None,
            split=None,
            index_cache_dir=indices,
            default_corpus=corpus,
        )
    if not data.paths:
        raise UserError("data.paths is an empty list; list dataset prefixes or set it to null for the default corpus")
    from megatron_mtp.data.prefixes import expand_blend

    train, train_weights = expand_blend(list(data.paths), data.weights, "data.paths")
    valid, valid_weights = (expand_blend(list(data.valid_paths), data.valid_weights, "data.valid_paths")
                            if data.valid_paths is not None else (None, None))
    tokenizer_path = _abs(data.tokenizer) if data.tokenizer else _tokenizer_from_meta(train + (valid or []))
    return ResolvedData(
        tokenizer_path=tokenizer_path,
        tokenizer=load_tokenizer(tokenizer_path),
        train_prefixes=train,
        train_weights=train_weights,
        valid_prefixes=valid,
        valid_weights=valid_weights,
        split=None if valid is not None else data.split,
        index_cache_dir=indices,
    )


def _tokenizer_from_meta(prefixes: list[str]) -> str:
    """The tokenizer recorded by `megatron-mtp preprocess` when all prefixes agree on one that exists."""
    recorded = set()
    for prefix in prefixes:
        meta = read_meta(prefix) or {}
        recorded.add((meta.get("tokenizer") or {}).get("path"))
    if len(recorded) == 1:
        (path,) = recorded
        if path and os.path.exists(path):
            return path
    raise UserError(
        "data.tokenizer is not set and the datasets do not record one tokenizer that still exists; "
        "set data.tokenizer to the tokenizer the data was preprocessed with"
    )


def _check_weights(name: str, weights: Optional[list[float]], prefixes: list[str], paths_name: str) -> None:
    if weights is None:
        return
    if len(weights) != len(prefixes):
        raise UserError(
            f"data.{name} has {len(weights)} entries but data.{paths_name} has {len(prefixes)}; "
            "give one weight per path"
        )
    if any(w < 0 or not math.isfinite(w) for w in weights) or sum(weights) <= 0:
        raise UserError(f"data.{name} is {weights}; weights must be finite, non-negative and not all zero")


def _split_vector(split: str) -> list[float]:
    if not _SPLIT_RE.match(split):
        raise UserError(
            f"data.split is '{split}'; write up to three comma-separated non-negative numbers such as '98,2,0'"
        )
    parts = [float(x) for x in split.split(",")] + [0.0, 0.0]
    parts = parts[:3]
    if sum(parts) <= 0 or parts[0] <= 0:
        raise UserError(f"data.split is '{split}'; the train part (the first number) must be positive")
    total = sum(parts)
    return [p / total for p in parts]


def _check_prefix(prefix: str, tok: Tokenizer) -> IndexInfo:
    info = check_indexed_pair(prefix)
    meta_tok = (info.meta or {}).get("tokenizer") or {}
    for field in ("vocab_size", "eod_id"):
        recorded = meta_tok.get(field)
        if recorded is not None and recorded != getattr(tok, field):
            raise UserError(
                f"dataset '{prefix}' was tokenised with a tokenizer whose {field} is {recorded}, but the run's "
                f"tokenizer '{tok.source}' has {getattr(tok, field)}; set data.tokenizer to the one used by preprocess"
            )
    fingerprint = meta_tok.get("fingerprint")
    if fingerprint and fingerprint != tok.fingerprint():
        warnings.warn(
            f"dataset '{prefix}' was tokenised with a different tokenizer file than '{tok.source}' "
            "(same vocab size and EOD)", stacklevel=2,
        )
    if info.tokens and info.dtype().itemsize == 2 and tok.vocab_size > 65536:
        raise UserError(
            f"dataset '{prefix}' stores 16-bit token ids but tokenizer '{tok.source}' has {tok.vocab_size} tokens; "
            "it was made with another tokenizer, re-run preprocess"
        )
    return info


def check_data_config(cfg: Any, resolved: ResolvedData) -> str:
    """Validate the data section against the files on disk and the model; raises UserError. Returns
    the start-up line that says what the run trains on (`data_line`)."""
    data = cfg.data
    tok = resolved.tokenizer
    tok.require_eod()
    _check_weights("weights", data.weights, data.paths or [], "paths")
    if data.valid_weights is not None and data.valid_paths is None:
        raise UserError("data.valid_weights is set but data.valid_paths is null; set both or neither")
    _check_weights("valid_weights", data.valid_weights, data.valid_paths or [], "valid_paths")
    _check_weights("weights", resolved.train_weights, resolved.train_prefixes, "paths")  # @list files' weights

    check_tokenizer_fits(cfg, tok.vocab_size, tok.source)

    infos = [_check_prefix(p, tok) for p in resolved.train_prefixes]
    for p in resolved.valid_prefixes or []:
        _check_prefix(p, tok)
    train_fraction = 1.0
    if resolved.split is not None:
        vector = _split_vector(resolved.split)
        train_fraction = vector[0]
        if cfg.logging.eval_interval > 0 and vector[1] == 0:
            raise UserError(
                f"logging.eval_interval is {cfg.logging.eval_interval} but data.split '{resolved.split}' "
                "leaves no validation part; give it one (e.g. '98,2,0') or set data.valid_paths"
            )
    need = cfg.training.seq_length + 1
    weights = resolved.train_weights or [1.0] * len(infos)
    for info, weight in zip(infos, weights):
        usable = int(info.tokens * train_fraction)
        if weight > 0 and usable < need:
            raise UserError(
                f"dataset '{info.prefix}' has {usable} tokens in its train split, fewer than one sequence of "
                f"training.seq_length+1 = {need}; use more data or a shorter training.seq_length"
            )
    if resolved.split is not None:
        _check_split_parts(resolved.split, infos, weights, cfg.logging.eval_steps > 0)
    note = passes_note(planned_train_samples(cfg), cfg.training.seq_length,
                       [int(i.tokens * train_fraction) for i in infos], resolved.train_weights,
                       resolved.train_prefixes)
    return data_line(resolved, infos, cfg.data) + note


def _check_split_parts(split: str, infos: list[IndexInfo], weights: list[float], evaluates: bool) -> None:
    """Each part a run draws from must hold a document of every dataset in the blend: megatron-core cuts
    a dataset's documents at round(bound · count), and a part with none would make its sampler loop
    forever (GPTDataset counts epochs until their tokens cover the samples)."""
    vector = _split_vector(split)
    bounds = [sum(vector[:i]) for i in range(4)]
    for info, weight in zip(infos, weights):
        for part, name in ((0, "train"), (1, "validation")):
            if weight <= 0 or vector[part] == 0 or (part == 1 and not evaluates):
                continue  # a part of share 0 is not built at all
            count = info.sequences
            if round(bounds[part + 1] * count) - round(bounds[part] * count) <= 0:
                raise UserError(
                    f"dataset '{info.prefix}' has {count} documents, so data.split '{split}' leaves its {name} "
                    f"part none; give it more documents, a larger {name} share in data.split, or set "
                    "data.valid_paths")


def data_line(resolved: ResolvedData, infos: list[IndexInfo], data: Any = None) -> str:
    """'data: ...': the datasets, their tokens and weights, the tokenizer and the document boundaries kept."""
    kept = [what for what, on in (("loss", getattr(data, "eod_mask_loss", False)),
                                  ("attention", getattr(data, "reset_attention_mask", False))) if on]
    return _data_line(resolved, infos) + (f"; documents kept apart in {' and '.join(kept)}" if kept else "")


def _data_line(resolved: ResolvedData, infos: list[IndexInfo]) -> str:
    tokens = sum(i.tokens for i in infos)
    tok = f"tokenizer {resolved.tokenizer_path} ({resolved.tokenizer.vocab_size} tokens)"
    if resolved.default_corpus is not None:
        own = "its own BPE" if resolved.default_corpus.tokenizer_dir.startswith(
            os.path.dirname(resolved.train_prefixes[0])) else tok
        return (f"data: the default corpus (this Python's standard library), {tokens:,} train tokens, {own}; "
                "set data.paths to train on your corpus")
    names = [os.path.basename(p) for p in resolved.train_prefixes]
    shown = ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
    if resolved.train_weights is None:
        blend = "blended by size"
    else:
        total = sum(resolved.train_weights)
        shares = [f"{w / total:.3g}" for w in resolved.train_weights[:3]]
        blend = "weights " + "/".join(shares) + ("/..." if len(names) > 3 else "")
    valid = (f"validation: {len(resolved.valid_prefixes)} datasets" if resolved.valid_prefixes is not None
             else f"split {resolved.split}")
    return f"data: {len(names)} datasets ({shown}), {tokens:,} tokens, {blend}; {valid}; {tok}"


@contextlib.contextmanager
def _process_group_for_builder():
    """A throw-away world-size-1 gloo group when torch.distributed is not initialised.

    megatron-core 0.16's BlendedDataset calls torch.distributed.get_rank() unconditionally when
    it caches indices, so a single process (tests, tools) needs some process group. The datasets
    use the group only while being built, so it is destroyed right after.
    """
    import torch.distributed as dist

    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


class MegatronTokenizerAdapter:
    """What megatron-core's GPTDataset reads from ``config.tokenizer``.

    ``vocab_size`` (token dtype), ``eod`` (masks/position ids), ``unique_identifiers`` (part of the
    index-cache hash, so a different tokenizer never reuses cached indices). It deliberately has no
    ``pad``: GPTDataset then pads short samples with -1, an id no real token has.
    """

    def __init__(self, tokenizer: Tokenizer):
        self.vocab_size = tokenizer.vocab_size
        self.eod = tokenizer.require_eod()
        self.eos = self.eod
        self.unique_identifiers = OrderedDict(
            [("class", type(self).__name__), ("fingerprint", tokenizer.fingerprint()),
             ("vocab_size", self.vocab_size), ("eod", self.eod)]
        )


def gpt_dataset_config(cfg: Any, resolved: ResolvedData):
    """megatron-core GPTDatasetConfig for this run."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.gpt_dataset import GPTDatasetConfig

    train = (resolved.train_prefixes, resolved.train_weights)
    blend = blend_per_split = split = None
    if resolved.valid_prefixes is None:
        blend, split = train, resolved.split
        _split_vector(split)
    else:
        blend_per_split = [train, (resolved.valid_prefixes, resolved.valid_weights), None]
    return GPTDatasetConfig(
        random_seed=cfg.training.seed,
        sequence_length=cfg.training.seq_length,
        blend=blend,
        blend_per_split=blend_per_split,
        split=split,
        path_to_cache=resolved.index_cache_dir,
        tokenizer=MegatronTokenizerAdapter(resolved.tokenizer),
        reset_position_ids=cfg.data.reset_position_ids,
        reset_attention_mask=cfg.data.reset_attention_mask,
        eod_mask_loss=cfg.data.eod_mask_loss,
        create_attention_mask=cfg.data.reset_attention_mask,
        mmap_bin_files=True,
    )


def build_datasets(cfg: Any, resolved: ResolvedData, train_samples: int, valid_samples: int):
    """(train, valid or None) megatron-core datasets of GPTDataset items (tokens, labels, loss_mask, position_ids).

    Call on every rank after torch.distributed is initialised (or without it in a single process).
    ``train_samples``/``valid_samples`` are the numbers of sequences the run will draw; blends are
    sized to them (megatron-core repeats epochs as needed). valid_samples=0 builds no validation set.
    The train dataset is a `Passes` over megatron-core's (data/passes.py): defined for any sample
    index, each pass past the built length in a new order; its `.built` is megatron-core's dataset.
    """
    from megatron_mtp.data.cpp_helpers import ensure_dataset_helpers

    if train_samples <= 0:
        raise UserError(f"train_samples is {train_samples}; it must be positive")
    ensure_dataset_helpers(os.path.dirname(resolved.index_cache_dir))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.datasets.gpt_dataset import GPTDataset

    config = gpt_dataset_config(cfg, resolved)
    if valid_samples <= 0 and config.blend_per_split is not None:
        config.blend_per_split[1] = None
    sizes = [train_samples, max(valid_samples, 0), 0]
    if resolved.train_weights is None and len(resolved.train_prefixes) > 1:
        # an unweighted blend holds one epoch of its datasets; megatron-core caps the request there, so
        # asking for at least that (a .bin holds at least a byte per token) builds the whole epoch (its
        # first samples are the ones a smaller request gives) and a pass past it (data/passes.py)
        # reshuffles the corpus, not the planned part
        sizes[0] = max(train_samples, sum(os.path.getsize(p + ".bin") for p in resolved.train_prefixes))
    os.makedirs(resolved.index_cache_dir, exist_ok=True)
    with _process_group_for_builder():
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    if valid_samples <= 0:
        valid = None
    return Passes(train, cfg.training.seed), valid
