"""gigatoken as preprocess's tokenizer backend: the same tokens as the HF tokenizer, about ten times
faster per core (tools/bench/bench_preprocess.py).

Design note. The dataset must not depend on the backend, so gigatoken is used only where it gives
the HF tokenizer's tokens, which is checked three ways:
- before the run (`fast_backend`, in the main process): gigatoken loads the tokenizer and encodes
  PROBE, texts that exercise what tokenizers differ on (whitespace runs, digits, accents, CJK,
  emoji, code, special-token look-alikes), to the HF tokenizer's ids; otherwise `auto` uses HF and
  says why, and an explicit `--tokenizer-backend gigatoken` is refused in one sentence;
- during the run, one document of each chunk (of median length) is also encoded by HF and compared; a difference
  stops the run naming the document (the output so far is discarded, as on any error);
- a chunk gigatoken cannot take (a lone surrogate escape, which no Rust tokenizer takes) goes
  through the HF path, which names the bad line as before.
gigatoken is part of the `corpus` extra; `auto` uses it when it is installed and passes the probe.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from megatron_mtp.errors import UserError

PROBE = [
    "Hello, world!  Two spaces,\ttab,\nnewline;\r\nCRLF and   many    spaces.",
    "1234567890 3.14159 -42 1e-10 0x1F 2024-12-06 12:30:00",
    "café naïve Straße Ångström résumé ﬁ ligature",
    "日本語のテキスト 中文文本 한국어 텍스트 Ελληνικά русский العربية",
    "emoji 😀👍🏽 🇫🇷 family 👨‍👩‍👧",
    "def f(x):\n    return x ** 2  # comment\n\n\nclass A:\n\tpass\n",
    "<|endoftext|> <s> </s> [CLS] <|begin_of_text|> <|end_of_text|>",
    "", " ", "\n\n\n", "a", "   leading and trailing   ",
]
BACKENDS = ("auto", "gigatoken", "hf")


def gigatoken_of(hf_tokenizer):
    """gigatoken's tokenizer for an HF `tokenizers` one (raises when gigatoken cannot take it)."""
    import gigatoken

    return gigatoken.Tokenizer(hf_tokenizer)


def _ids(fast, texts: list[str]) -> list[list[int]]:
    import awkward as ak

    return ak.to_list(fast.encode_batch(texts))


def fast_backend(hf_tokenizer, asked: str) -> tuple[str, Optional[str]]:
    """('gigatoken' or 'hf', a note on why not gigatoken under auto) for `--tokenizer-backend asked`."""
    if asked not in BACKENDS:
        raise UserError(f"--tokenizer-backend {asked} is not one of {', '.join(BACKENDS)}")
    if asked == "hf":
        return "hf", None
    try:
        fast = gigatoken_of(hf_tokenizer)
        same = _ids(fast, PROBE) == [e.ids for e in hf_tokenizer.encode_batch(PROBE, add_special_tokens=False)]
        why = None if same else "it gives other tokens than the tokenizer's own on the probe texts"
    except ImportError:
        why = "it is not installed (pip install 'megatron-mtp[corpus]')"
    except Exception as exc:  # a tokenizer kind gigatoken does not support
        why = f"it cannot load this tokenizer ({type(exc).__name__}: {str(exc)[:120]})"
    if why is None:
        return "gigatoken", None
    if asked == "gigatoken":
        raise UserError(f"--tokenizer-backend gigatoken cannot be used: {why}; use --tokenizer-backend hf or auto")
    return "hf", f"tokenizing with the HF tokenizer, not gigatoken: {why}"


def encode_flat(fast, hf_tokenizer, texts: list[str], eod_id: Optional[int], file_index: int,
                line_numbers: list[int]):
    """(all tokens int32, lengths int64, empty documents) of `texts`, EOD appended when set; None when
    gigatoken cannot take the texts (the caller's HF path then handles them)."""
    import awkward as ak

    try:
        out = fast.encode_batch(texts)
    except Exception:  # e.g. a lone surrogate: the HF path names the line
        return None
    counts = ak.num(out).to_numpy().astype(np.int64)
    flat = ak.flatten(out).to_numpy().astype(np.int32)
    if len(texts):
        pick = int(np.argsort(counts, kind="stable")[len(counts) // 2])  # a typical document, cheap to redo
        start = int(counts[:pick].sum())
        mine = flat[start:start + int(counts[pick])].tolist()
        if mine != hf_tokenizer.encode(texts[pick], add_special_tokens=False).ids:
            raise UserError(f"gigatoken gave other tokens than the tokenizer's own for the document at input "
                            f"{file_index + 1}, line/row {line_numbers[pick]}; rerun with --tokenizer-backend hf")
    if eod_id is not None:
        flat = np.insert(flat, np.cumsum(counts), np.int32(eod_id))
        counts = counts + 1
    empty = int((counts == 0).sum())
    return flat, counts[counts > 0], empty
