"""`megatron-mtp preprocess`, `merge-datasets` and `tokenizer train`: parse arguments and call in.

No torch or megatron-core import at module level (keeps `megatron-mtp --help` instant).
"""

from __future__ import annotations

import argparse

from megatron_mtp.errors import UserError


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "preprocess",
        help="tokenize corpora (JSONL, Parquet, Arrow) into a megatron-core indexed dataset (PREFIX.bin/.idx)",
        description="Tokenize corpora into a megatron-core indexed dataset: JSONL (plain, gzip or zstd; one "
        "JSON object per line), Parquet or Arrow files (HF datasets' save_to_disk directories too), one "
        "document per line or row. Output is written to temporary names and renamed at the end; it is "
        "identical for any --workers. With --shard I/N (a Slurm array), tokenize the I-th of N blocks of "
        "the inputs into PREFIX_shard-I-of-N, then join them with `megatron-mtp merge-datasets` or train "
        "on them as data.paths=[PREFIX_shard-*].",
    )
    p.add_argument("--input", nargs="+", required=True, metavar="INPUT",
                   help="files, directories, globs (quoted) or @FILE lists of them, read in the given order")
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
    p.add_argument("--max-document-bytes", type=int, default=None, metavar="N",
                   help="a document of more than N bytes of text is a bad line, not tokenised (default: 8 MiB; "
                   "tokenising takes about 150 bytes of memory per byte of text; 0: no limit)")
    p.add_argument("--tokenizer-backend", default="auto", choices=("auto", "gigatoken", "hf"),
                   help="auto (default): gigatoken when installed and it gives this tokenizer's tokens, else the HF "
                   "tokenizer; the output is the same either way")
    p.add_argument("--shard", default=None, metavar="I/N",
                   help="tokenize only the I-th (from 0) of N contiguous blocks of the input files, into "
                   "PREFIX_shard-I-of-N (e.g. --shard $SLURM_ARRAY_TASK_ID/$SLURM_ARRAY_TASK_COUNT)")
    p.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    p.set_defaults(func=run_preprocess)

    m = subparsers.add_parser(
        "merge-datasets",
        help="join indexed datasets (the shards of a sharded preprocess) into one",
        description="Concatenate indexed datasets made with one tokenizer, in order, into PREFIX.bin/.idx. "
        "The shards of `preprocess --shard` are put in index order and must all be present; the result "
        "equals the unsharded preprocess byte for byte.",
    )
    m.add_argument("--input", nargs="+", required=True, metavar="PREFIX",
                   help="dataset prefixes, globs over prefixes (quoted) or @FILE lists of them")
    m.add_argument("--output-prefix", required=True, metavar="PREFIX",
                   help="write PREFIX.bin, PREFIX.idx and PREFIX.meta.json")
    m.add_argument("--no-progress", action="store_true", help="do not show a progress bar")
    m.set_defaults(func=run_merge)

    t = subparsers.add_parser("tokenizer", help="tokenizer utilities (train a byte-level BPE)")
    tsub = t.add_subparsers(dest="tokenizer_command", metavar="ACTION")
    tsub.required = True
    tr = tsub.add_parser(
        "train",
        help="train a byte-level BPE tokenizer",
        description="Train a byte-level BPE with special tokens <|begin_of_text|> (BOS) and <|end_of_text|> (EOD). "
        "Inputs named *.jsonl/*.json (optionally .gz or .zst) give one document per line (--text-key), Parquet "
        "and Arrow files one per row; other files are plain text, one document each. The output directory loads "
        "with transformers.AutoTokenizer.",
    )
    tr.add_argument("--input", nargs="+", required=True, metavar="INPUT",
                    help="training files, directories, globs (quoted) or @FILE lists of them")
    tr.add_argument("--vocab-size", type=int, required=True, metavar="V", help="vocabulary size (>= 258)")
    tr.add_argument("--output", required=True, metavar="DIR", help="directory to write the tokenizer into")
    tr.add_argument("--text-key", default="text", help="JSON key of the text in JSONL inputs (default: text)")
    tr.add_argument("--min-frequency", type=int, default=2, help="minimum pair count for a merge (default: 2)")
    tr.set_defaults(func=run_tokenizer_train)


def run_preprocess(args: argparse.Namespace) -> int:
    from megatron_mtp.data.preprocess import MAX_DOCUMENT_BYTES, preprocess, resolve_workers
    from megatron_mtp.data.shards import parse_shard

    limit = MAX_DOCUMENT_BYTES if args.max_document_bytes is None else args.max_document_bytes
    stats = preprocess(
        max_document_bytes=limit or None,
        shard=parse_shard(args.shard) if args.shard is not None else None,
        tokenizer_backend=args.tokenizer_backend,
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


def run_merge(args: argparse.Namespace) -> int:
    from megatron_mtp.data.prefixes import expand_blend
    from megatron_mtp.data.shards import merge_datasets

    prefixes, _ = expand_blend(args.input, None, "--input")
    meta = merge_datasets(prefixes, args.output_prefix, progress=not args.no_progress)
    print(f"wrote {args.output_prefix}.bin/.idx: {meta['documents']} documents, {meta['tokens']} tokens from "
          f"{len(prefixes)} datasets in {meta['seconds']:.1f}s")
    return 0


def run_tokenizer_train(args: argparse.Namespace) -> int:
    import os

    from megatron_mtp.data.sources import expand_inputs, input_kind, iter_texts
    from megatron_mtp.data.tokenizer import train_bpe
    from megatron_mtp.output import staged_dir

    args.input = expand_inputs(args.input)
    for path in args.input:
        input_kind(path)
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
