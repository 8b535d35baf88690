"""A thin wrapper around a Hugging Face `tokenizers` tokenizer, and byte-level BPE training.

The wrapper answers the few questions the rest of the project asks of a tokenizer (vocabulary
size, the end-of-document id, encode/decode without added special tokens) and saves itself as a
directory that `transformers.AutoTokenizer` can load, so a checkpoint's `tokenizer/` folder is
usable by HF tooling as is.

Special tokens of the tokenizers this project trains: ``<|begin_of_text|>`` (id 0, BOS) and
``<|end_of_text|>`` (id 1, EOD). For tokenizers brought by users the EOD/BOS tokens are taken from
``tokenizer_config.json`` (``eos_token``/``bos_token``) when present, else from a list of
well-known spellings.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Optional, Union

from megatron_mtp.errors import UserError

BOS_TOKEN = "<|begin_of_text|>"
EOD_TOKEN = "<|end_of_text|>"

# Spellings of end-of-document / begin-of-text tokens in common tokenizers, tried in order when a
# tokenizer does not name its own in tokenizer_config.json.
_KNOWN_EOD = (EOD_TOKEN, "<|endoftext|>", "<｜end▁of▁sentence｜>", "</s>", "<eos>", "<|eot_id|>")
_KNOWN_BOS = (BOS_TOKEN, "<｜begin▁of▁sentence｜>", "<s>", "<bos>")

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SPECIAL_TOKENS_FILE = "special_tokens_map.json"


def _token_name(entry: object) -> Optional[str]:
    """tokenizer_config.json spells special tokens as strings or as {"content": ...} objects."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("content"), str):
        return entry["content"]
    return None


class Tokenizer:
    """A `tokenizers.Tokenizer` plus its end-of-document and begin-of-text token ids."""

    def __init__(self, backend, eod_token: Optional[str], bos_token: Optional[str], source: str = "<memory>"):
        self._tok = backend
        self.source = source
        """Where the tokenizer was loaded from (for messages)."""
        self.eod_token = eod_token
        self.bos_token = bos_token
        self.eod_id: Optional[int] = backend.token_to_id(eod_token) if eod_token else None
        """Id of the end-of-document token (None when the tokenizer has none)."""
        self.bos_id: Optional[int] = backend.token_to_id(bos_token) if bos_token else None
        """Id of the begin-of-text token (None when the tokenizer has none)."""
        if eod_token and self.eod_id is None:
            raise UserError(
                f"tokenizer '{source}' names '{eod_token}' as its end-of-document token "
                "but its vocabulary lacks it; fix eos_token in tokenizer_config.json"
            )
        if bos_token and self.bos_id is None:
            self.bos_token = None
        vocab = backend.get_vocab(with_added_tokens=True)
        self.vocab_size: int = max(backend.get_vocab_size(with_added_tokens=True), max(vocab.values(), default=-1) + 1)
        """Number of token ids (largest id + 1, added tokens included)."""

    @property
    def backend(self):
        """The underlying `tokenizers.Tokenizer`."""
        return self._tok

    def require_eod(self) -> int:
        """The EOD id, or a UserError when the tokenizer has no end-of-document token."""
        if self.eod_id is None:
            raise UserError(
                f"tokenizer '{self.source}' has no end-of-document token; add \"eos_token\" to its "
                f"{TOKENIZER_CONFIG_FILE} or train one with `megatron-mtp tokenizer train`"
            )
        return self.eod_id

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` with nothing added (no BOS/EOS)."""
        return self._tok.encode(text, add_special_tokens=False).ids

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of several texts (nothing added)."""
        return [e.ids for e in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Iterable[int]) -> str:
        """Text of ``ids`` (special tokens are kept)."""
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def fingerprint(self) -> str:
        """A short hash of the tokenizer's full serialisation (identifies it in dataset metadata)."""
        return hashlib.sha256(self._tok.to_str().encode("utf-8")).hexdigest()[:16]

    def save(self, directory: Union[str, os.PathLike]) -> Path:
        """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json into ``directory``.

        The result loads with ``transformers.AutoTokenizer.from_pretrained(directory)``.
        Files are written to temporary names and renamed, so a crash leaves no half-written file.
        """
        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        special = {}
        if self.bos_token:
            special["bos_token"] = self.bos_token
        if self.eod_token:
            special["eos_token"] = self.eod_token
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": 1_000_000_000,
            "add_bos_token": False,
            "add_eos_token": False,
            "clean_up_tokenization_spaces": False,
            **special,
        }
        files = {
            TOKENIZER_FILE: self._tok.to_str(pretty=True),
            TOKENIZER_CONFIG_FILE: json.dumps(config, indent=2, ensure_ascii=False),
            SPECIAL_TOKENS_FILE: json.dumps(special, indent=2, ensure_ascii=False),
        }
        for name, text in files.items():
            _atomic_write_text(out / name, text)
        return out


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _atomic_write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes the file private; a tokenizer is shared like any file
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def load_tokenizer(path: Union[str, os.PathLike]) -> Tokenizer:
    """Load a tokenizer.json file, or a directory holding one (an HF model directory works)."""
    from tokenizers import Tokenizer as HFTokenizer

    p = Path(path)
    if p.is_dir():
        file = p / TOKENIZER_FILE
        if not file.is_file():
            raise UserError(
                f"tokenizer directory '{p}' has no {TOKENIZER_FILE}; save a fast tokenizer there "
                "(e.g. `AutoTokenizer.from_pretrained(...).save_pretrained(dir)`) "
                "or train one with `megatron-mtp tokenizer train`"
            )
        config_file = p / TOKENIZER_CONFIG_FILE
    elif p.is_file():
        file = p
        config_file = p.parent / TOKENIZER_CONFIG_FILE
    else:
        raise UserError(f"tokenizer path '{p}' does not exist; pass a tokenizer.json file or a directory holding one")
    try:
        backend = HFTokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises a bare Exception on bad JSON
        raise UserError(
            f"tokenizer file '{file}' cannot be read by the `tokenizers` library ({str(exc).splitlines()[0]}); "
            "pass a valid tokenizer.json"
        ) from None

    eod = bos = None
    if config_file.is_file():
        try:
            config = json.loads(config_file.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise UserError(f"tokenizer config '{config_file}' is not valid JSON ({exc}); fix or remove it") from None
        if isinstance(config, dict):
            eod = _token_name(config.get("eos_token"))
            bos = _token_name(config.get("bos_token"))
    vocab = backend.get_vocab(with_added_tokens=True)
    if eod is None:
        eod = next((t for t in _KNOWN_EOD if t in vocab), None)
    if bos is None:
        bos = next((t for t in _KNOWN_BOS if t in vocab), None)
    return Tokenizer(backend, eod, bos, source=str(p))


def new_byte_level_bpe():
    """An untrained byte-level BPE `tokenizers.Tokenizer` (GPT-2 style pre-tokenisation)."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import decoders, models, pre_tokenizers, processors

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    return tok


def train_bpe(
    files_or_iterator: Union[Sequence[Union[str, os.PathLike]], Iterable[str]],
    vocab_size: int,
    output_dir: Union[str, os.PathLike, None] = None,
    min_frequency: int = 2,
    show_progress: bool = False,
) -> Tokenizer:
    """Train a byte-level BPE with special tokens <|begin_of_text|> (id 0) and <|end_of_text|> (id 1).

    ``files_or_iterator`` is a list/tuple of plain-text file paths, or any other iterable (e.g. a
    generator or ``iter(list_of_texts)``) of document strings.
    The vocabulary holds the 256 byte symbols and the two special tokens, so ``vocab_size`` must
    be at least 258. When ``output_dir`` is given the tokenizer is saved there (see Tokenizer.save).
    """
    from tokenizers import pre_tokenizers, trainers

    if vocab_size < 258:
        raise UserError(
            f"vocab size {vocab_size} is too small for a byte-level BPE; "
            "use at least 258 (256 bytes + 2 special tokens)"
        )
    tok = new_byte_level_bpe()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=[BOS_TOKEN, EOD_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    if isinstance(files_or_iterator, (list, tuple)):
        files = [str(f) for f in files_or_iterator]
        for f in files:
            if not os.path.isfile(f):
                raise UserError(f"tokenizer training input '{f}' does not exist or is not a file")
        tok.train(files, trainer)
    else:
        tok.train_from_iterator(files_or_iterator, trainer)
    result = Tokenizer(tok, EOD_TOKEN, BOS_TOKEN, source=str(output_dir) if output_dir else "<trained>")
    if output_dir is not None:
        result.save(output_dir)
    return result
