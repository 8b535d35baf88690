"""`megatron-mtp preprocess` and `megatron-mtp tokenizer train`: parse arguments and call in.

No torch or megatron-core import at module level (keeps `megatron-mtp --help` instant).
"""

from __future__ import annotations

import argparse

from megatron_mtp.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "preprocess",
        help="tokenize JSONL corpora into a megatron-core indexed dataset (PREFIX.bin/.idx)",
        description="Tokenize JSONL files (plain or gzip; one JSON object per line) into a megatron-core "
        "indexed dataset. Each line becomes one document. Output is written to temporary names and "
        "renamed at the end; it is identical for any --workers.",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="FILE",
                   help="JSONL files (plain or .gz), read in the given order")
    p.add_argument("--tokenizer", required=True, metavar="PATH",
                   help="tokenizer.json, or a directory holding one (an HF model dir works)")
    p.add_argument("--output-prefix", required=True, metavar="PREFIX",
                   help="write PREFIX.bin, PREFIX.idx and PREFIX.meta.json")
    p.add_argument("--text-key", default="text", help="JSON key holding the document text (default: text)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="tokenizing processes (default: the CPUs available)")
    p.add_argument("--append-eod", action="store_true",
                   help="append the tokenizer's end-of-document token to every document")
    p.add_argument("--skip-bad-lines", action="store_true",
                   help="skip (and count) malformed lines instead of stopping at the first")
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    p.set_defaults(func=run_preprocess)

    t = subparsers.add_parser("tokenizer", help="tokenizer utilities (train a byte-level BPE)")
    tsub = t.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    tsub.required = True
    tr = tsub.add_parser(
        "train",
        help="train a byte-level BPE tokenizer",
        description="Train a byte-level BPE with special tokens <|begin_of_text|> (BOS) and <|end_of_text|> (EOD). "
        "Inputs named *.jsonl/*.json (optionally .gz) give one document per line (--text-key); other files "
        "are plain text, one document each. The output directory loads with transformers.AutoTokenizer.",
    )
    tr.add_argument("--input", nargs="+", required=True, metavar="FILE", help="training files")
    tr.add_argument("--vocab-size", type=int, required=True, metavar="V", help="vocabulary size (>= 258)")
    tr.add_argument("--output", required=True, metavar="DIR", help="directory to write the tokenizer into")
    tr.add_argument("--text-key", default="text", help="JSON key of the text in JSONL inputs (default: text)")
    tr.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge (default: 2)")
    tr.set_defaults(func=run_tokenizer_train)


def run_preprocess(args: argparse.Namespace) -> int:
    from megatron_mtp.data.preprocess import preprocess, resolve_workers

    stats = preprocess(
        inputs=args.input,
        tokenizer=args.tokenizer,
        output_prefix=args.output_prefix,
        text_key=args.text_key,
        workers=resolve_workers(args.workers),
        append_eod=args.append_eod,
        skip_bad_lines=args.skip_bad_lines,
        progress=not args.no_progress,
    )
    print(stats.summary())
    return 0


def run_tokenizer_train(args: argparse.Namespace) -> int:
    import os

    from megatron_mtp.data.jsonl import iter_texts, open_input
    from megatron_mtp.data.tokenizer import train_bpe
    from megatron_mtp.output import staged_dir

    for path in args.input:
        open_input(path)[1].close()
    if os.path.isfile(args.output):
        raise UserError(f"tokenizer output '{args.output}' is a file; pass a directory")
    # Train into a temporary directory beside the output, then rename it into place (an empty
    # directory there is replaced; anything else is refused, as by every writing command).
    with staged_dir(args.output, may_exist_empty=True, make_parents=True) as tmp:
        seen = {"bytes": 0}

        def texts():
            for text in iter_texts(args.input, args.text_key):
                seen["bytes"] += len(text)
                yield text

        tok = train_bpe(texts(), args.vocab_size, tmp, min_frequency=args.min_frequency, show_progress=True)
        if not seen["bytes"]:
            raise UserError(f"the tokenizer training input ({', '.join(args.input)}) holds no text; "
                            "a tokenizer learned from nothing would only know the 256 bytes")
    print(
        f"wrote a byte-level BPE tokenizer ({tok.vocab_size} tokens, EOD id {tok.eod_id}, BOS id {tok.bos_id}) "
        f"to {args.output}"
    )
    return 0
