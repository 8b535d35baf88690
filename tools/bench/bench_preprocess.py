"""Benchmark `megatron-mtp preprocess`: N workers vs 1 worker vs the tokenizer's raw batch encode.

One run, same text for every measurement:
  raw-1     `tokenizers` encode_batch on the in-memory texts, single-threaded (TOKENIZERS_PARALLELISM=false)
  raw-all   the same with the library's own thread pool (all cores; for reference)
  pre-1     preprocess with 1 worker (in-process): read JSONL, parse, tokenize, write .bin/.idx
  pre-N     preprocess with N worker processes
  giga-1, giga-N  the same with --tokenizer-backend gigatoken (checked to write the same bytes)
Ratios printed: pre-1 / raw-1, and pre-N / (N × raw-1) = wall-clock throughput per core used
relative to the raw tokenizer (target ≥ 0.8), plus the N-worker speedup over 1 worker. Because a
shared machine distorts wall-clock scaling, the same ratios are also printed per CPU-second
(tokens / CPU time of this process and its worker processes), which measures the work spent per
token independently of contention. Timings exclude the one-off megatron-core import. The corpus
is the Python standard library's source as JSONL, repeated up to --mb megabytes.

    python tools/bench/bench_preprocess.py [--mb 16] [--workers N] [--tokenizer PATH] [--repeats 2]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time


def _corpus(mb: float) -> list[str]:
    from megatron_mtp.data.default_corpus import select_files

    train, valid = select_files(max_bytes=64_000_000)
    files = [t for _, t in train + valid]
    texts, total, i = [], 0, 0
    while total < mb * 1e6:
        texts.append(files[i % len(files)])
        total += len(files[i % len(files)].encode("utf-8"))
        i += 1
    return texts


def _raw(tok, texts: list[str], parallel: bool) -> tuple[float, int]:
    saved = os.environ.get("TOKENIZERS_PARALLELISM")
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    try:
        start = time.perf_counter()
        tokens = sum(len(e.ids) for e in tok.backend.encode_batch(texts, add_special_tokens=False))
        return time.perf_counter() - start, tokens
    finally:
        if saved is None:
            os.environ.pop("TOKENIZERS_PARALLELISM", None)
        else:
            os.environ["TOKENIZERS_PARALLELISM"] = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=16.0, help="megabytes of JSONL text (default 16)")
    parser.add_argument("--workers", type=int, default=None, help="N for the parallel run (default: CPUs available)")
    parser.add_argument("--tokenizer", default=None, help="tokenizer to use (default: a 4096-token BPE trained here)")
    parser.add_argument("--repeats", type=int, default=2, help="best of this many runs per measurement")
    args = parser.parse_args()

    from megatron_mtp.data.indexed import token_dtype
    from megatron_mtp.data.preprocess import available_cpus, default_workers, preprocess
    from megatron_mtp.data.tokenizer import load_tokenizer, train_bpe

    workers = args.workers or default_workers()
    texts = _corpus(args.mb)
    with tempfile.TemporaryDirectory(prefix="bench_preprocess_") as tmp:
        if args.tokenizer:
            tok = load_tokenizer(args.tokenizer)
        else:
            train_bpe(iter(texts[:400]), 4096, os.path.join(tmp, "tok"))
            tok = load_tokenizer(os.path.join(tmp, "tok"))
        path = os.path.join(tmp, "corpus.jsonl")
        with open(path, "w", encoding="utf-8") as fh:
            for t in texts:
                fh.write(json.dumps({"text": t}) + "\n")
        size = os.path.getsize(path)
        token_dtype(tok.vocab_size)  # import megatron-core once, outside the timings

        results: dict[str, tuple[float, int]] = {}
        cpu: dict[str, float] = {}
        for _ in range(args.repeats):
            for name, fn in (
                ("raw-1", lambda: _raw(tok, texts, parallel=False)),
                ("raw-all", lambda: _raw(tok, texts, parallel=True)),
                ("pre-1", lambda: _pre(preprocess, path, tok, tmp, 1)),
                (f"pre-{workers}", lambda: _pre(preprocess, path, tok, tmp, workers)),
                ("giga-1", lambda: _pre(preprocess, path, tok, tmp, 1, "gigatoken")),
                (f"giga-{workers}", lambda: _pre(preprocess, path, tok, tmp, workers, "gigatoken")),
            ):
                cpu_before = _cpu_seconds()
                seconds, tokens = fn()
                cpu_used = _cpu_seconds() - cpu_before
                if name not in results or seconds < results[name][0]:
                    results[name] = (seconds, tokens)
                cpu[name] = min(cpu.get(name, float("inf")), cpu_used)
        same = all(_read(tmp, f"out{w}-hf") == _read(tmp, f"out{w}-gigatoken") for w in (1, workers))

    cpus = available_cpus()
    print(f"corpus: {len(texts)} documents, {size / 1e6:.1f} MB JSONL, tokenizer {tok.vocab_size} tokens, "
          f"{cpus} CPUs available, best of {args.repeats}")
    print(f"{'run':<10}{'seconds':>10}{'tokens/s':>14}{'MB/s':>8}{'CPU s':>9}{'tokens/CPU-s':>14}")
    for name, (seconds, tokens) in results.items():
        print(f"{name:<10}{seconds:>10.2f}{tokens / seconds:>14,.0f}{size / 1e6 / seconds:>8.2f}"
              f"{cpu[name]:>9.2f}{tokens / cpu[name]:>14,.0f}")
    per_cpu = {k: results[k][1] / cpu[k] for k in results}
    rate = {k: v[1] / v[0] for k, v in results.items()}
    tokens = {v[1] for k, v in results.items() if k.startswith("pre")}
    print(f"pre-1 / raw-1                        = {rate['pre-1'] / rate['raw-1']:.2f}")
    print(f"pre-{workers} / ({workers} x raw-1)  (per core used) = "
          f"{rate[f'pre-{workers}'] / (workers * rate['raw-1']):.2f}   (target >= 0.80)")
    print(f"pre-{workers} / pre-1  (speedup)           = {rate[f'pre-{workers}'] / rate['pre-1']:.2f}")
    print(f"raw-all / raw-1 (library threads)     = {rate['raw-all'] / rate['raw-1']:.2f}")
    print("per CPU-second (independent of machine load):")
    print(f"  pre-1 / raw-1                       = {per_cpu['pre-1'] / per_cpu['raw-1']:.2f}")
    print(f"  pre-{workers} / raw-1                       = "
          f"{per_cpu[f'pre-{workers}'] / per_cpu['raw-1']:.2f}   (target >= 0.80)")
    print(f"giga-1 / pre-1  (gigatoken over the HF tokenizer, one worker) = {rate['giga-1'] / rate['pre-1']:.2f}")
    print(f"giga-{workers} / pre-{workers}  (the same, {workers} workers)            = "
          f"{rate[f'giga-{workers}'] / rate[f'pre-{workers}']:.2f}")
    print(f"gigatoken's .bin/.idx equal the HF tokenizer's: {same}")
    tokens |= {v[1] for k, v in results.items() if k.startswith("giga")}
    if not same or len(tokens) != 1 or results["raw-1"][1] != tokens.pop():
        print("WARNING: token counts differ between runs", file=sys.stderr)
        return 1
    return 0


def _cpu_seconds() -> float:
    """User+system CPU time of this process and of its finished (reaped) child processes."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    kids = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def _pre(preprocess, path: str, tok, tmp: str, workers: int, backend: str = "hf") -> tuple[float, int]:
    stats = preprocess([path], tok, os.path.join(tmp, f"out{workers}-{backend}"), workers=workers, progress=False,
                       tokenizer_backend=backend)
    return stats.seconds, stats.tokens


def _read(tmp: str, prefix: str) -> bytes:
    return b"".join(open(os.path.join(tmp, prefix + ext), "rb").read() for ext in (".bin", ".idx"))


if __name__ == "__main__":
    sys.exit(main())
