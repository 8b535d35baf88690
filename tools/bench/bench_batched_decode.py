"""Batched decoding, plain and with MTP drafts, on CPU: measured speedup beside the bytes model's prediction.

    python tools/bench/bench_batched_decode.py RUN_OR_CKPT [RUN_OR_CKPT ...] [--batches 1,4,16]
        [--ks 1,2,3] [--prompts 16] [--max-new-tokens 32] [--repeats 2] [--json OUT]

Each model (a megatron-mtp run directory or checkpoint, whose config.yaml gives the sizes the prediction
needs, or an HF export; sequential MTP modules or parallel heads) decodes the same --prompts prompts at
each batch size B (continuous batching, B in flight) plainly and with K drafts, greedy, EOS ignored; every (B, K) runs
--repeats times interleaved and the fastest decode phase (wall time minus prefills) is kept. Columns:
- tok/s plain and speculative, and the measured speedup (their ratio; the outputs are identical, checked);
- tokens committed per sequence and round, the acceptance per draft position; seq/fwd: sequences per
  decode forward (B until the first sequences finish; a speculative run's sequences finish in
  different rounds, a plain run's together);
- distinct routed experts per MoE layer in a verify forward (B·(K+1) tokens) over a plain one (B tokens),
  measured, and under uniform routing;
- pred(bytes): plan/speculative.py's model (a forward reads dense weights, the touched experts and the KV
  cache; time = bytes / bandwidth) fed the CPU's read bandwidth measured here (one thread), the measured
  expert counts and acceptances: tokens/round × t_plain / (t_verify + K·t_draft);
- pred(timed): the same round accounting with the forward times measured in this run instead of bytes.
pred(timed) ≈ measured checks the accounting; pred(bytes) vs measured checks whether this machine's
decoding is bandwidth-bound (a tiny model on CPU is not: its weights sit in cache and per-forward
overhead dominates; see inference/README.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _report import cli_main, write_json  # noqa: E402  (siblings of this script)
from bench_speculative import HELD_OUT_PROMPTS  # noqa: E402

PROMPTS = [
    *HELD_OUT_PROMPTS,  # bench_speculative.py's, then more: enough for B = 16
    "def read_lines(path, encoding='utf-8'):\n    with open(path, encoding=encoding) as f:\n",
    "class Matrix:\n    def __init__(self, rows, cols):\n        self.rows = rows\n",
    "try:\n    import numpy as np\nexcept ImportError:\n",
    "def merge_sorted(a, b):\n    result = []\n    i = j = 0\n",
    "import os\nimport sys\n\n\ndef main(argv=None):\n    if argv is None:\n",
    "def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__,\n",
    "with open(filename, 'rb') as fp:\n    data = fp.read()\n",
    "def is_prime(n):\n    if n < 2:\n        return False\n",
]


def cpu_read_bandwidth(megabytes: int = 256, repeats: int = 5) -> float:
    """Bytes per second one thread reads from memory (sum over a buffer far larger than the caches)."""
    import torch

    data = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - t0)
    return data.numel() * 4 / best


def predicted_speedup(cfg, vocab: int, batch: int, k: int, acceptance: list[float], plain_experts: float,
                      verify_experts: float, context: int, bandwidth: float, weight_bytes: int) -> dict:
    """plan/speculative.py's bytes model on this machine: memory time of a plain forward, a verify forward
    and k draft steps with the measured expert counts, and the speedup they predict."""
    from megatron_mtp.plan.speculative import ServeLayout, draft_step_bytes, main_forward_bytes, tokens_per_round
    from megatron_mtp.platform.gpus import Gpu

    cpu = Gpu("CPU", 0, hbm_bytes_per_s=bandwidth)
    serve = ServeLayout(weight_bytes=weight_bytes, kv_bytes=weight_bytes, context=context)
    plain = main_forward_bytes(cfg, vocab, batch, batch, serve, plain_experts)
    verify = main_forward_bytes(cfg, vocab, batch, batch * (k + 1), serve, verify_experts)
    draft = draft_step_bytes(cfg, vocab, batch, serve)
    t_plain, t_verify, t_draft = (f.seconds(cpu, fp8=False) for f in (plain, verify, draft))
    per_round = tokens_per_round(acceptance or [0.0], k)
    return {"plain_bytes": plain.total, "verify_bytes": verify.total, "draft_bytes": draft.total,
            "speedup": per_round * t_plain / (t_verify + k * t_draft), "tokens_per_round": per_round}


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="megatron-mtp run directories, checkpoints or HF exports (with MTP)")
    parser.add_argument("--batches", default="1,4,16")
    parser.add_argument("--ks", default="1,2,3")
    parser.add_argument("--prompts", type=int, default=16, help="prompts decoded at every batch size (default 16)")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", help="also write the results to this JSON file")
    return parser.parse_args(argv)


def _ints(text: str, flag: str) -> list[int]:
    from megatron_mtp.errors import UserError

    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{flag} must be comma-separated whole numbers like 1,4,16 (got {text!r}).") from None
    if not values or min(values) < 1:
        raise UserError(f"{flag} must list whole numbers of at least 1 (got {text!r}).")
    return values


def model_config(path: str, gen):
    """The sizes the bytes model needs: a run's config.yaml, or an HF export's config.json as the converter
    reads it (MTP depth and style from the loaded drafter)."""
    import dataclasses

    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.config.root import Config
    from megatron_mtp.inference.model_dir import find_export_dirs
    from megatron_mtp.models.family import family_of_hf_config

    root = Path(path)
    if not ((root / "config.json").is_file() or (root / "main" / "config.json").is_file()):
        return read_config(resolve_checkpoint(path).path)
    where = find_export_dirs(root).main_dir / "config.json"
    raw = json.loads(where.read_text())
    model, mtp, _ = family_of_hf_config(raw).from_hf_config(raw, str(where))
    style = "parallel" if hasattr(gen.drafter, "heads") else "sequential"
    return Config(model=model, mtp=dataclasses.replace(mtp, num_layers=gen.drafter.depth, style=style))


def bench_model(path: str, batches: list[int], ks: list[int], prompts: list[str], max_new: int, repeats: int,
                bandwidth: float) -> list[dict]:
    from megatron_mtp.config.vocab import resolve_vocab
    from megatron_mtp.errors import UserError
    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(path)
    if not gen.has_mtp:
        raise UserError(f"{path} has no MTP module to draft with; train it with mtp.num_layers >= 1.")
    if not gen.config.n_routed_experts:
        raise UserError(f"{path} is a dense model; this benchmark compares the experts MoE forwards touch.")
    cfg = model_config(path, gen)
    vocab = resolve_vocab(cfg)
    ks = [k for k in ks if k <= getattr(gen.drafter, "max_draft", k)]
    gen.generate_batch(prompts[:2], batch_size=2, max_new_tokens=4, ignore_eos=True)  # warm-up
    best: dict[tuple[int, int], object] = {}
    for _ in range(repeats):
        for b in batches:
            for k in [0, *ks]:
                run = gen.generate_batch(prompts, batch_size=b, max_new_tokens=max_new, speculative_k=k,
                                         ignore_eos=True)
                decode_s = run.stats.wall_time_s - run.stats.prefill_time_s
                if (b, k) not in best or decode_s < best[(b, k)][0]:
                    best[(b, k)] = (decode_s, run)
    context = int(sum(len(gen.encode(p)) for p in prompts) / len(prompts) + max_new / 2)
    rows = []
    for b in batches:
        plain_s, plain = best[(b, 0)]
        plain_tps = plain.stats.decode_tokens / plain_s
        t_plain = plain.stats.target_time_s / plain.stats.decode_forwards
        plain_experts = plain.stats.experts["plain"]["distinct_experts"]
        for k in ks:
            spec_s, spec = best[(b, k)]
            s = spec.stats
            same = [r.tokens for r in spec.results] == [r.tokens for r in plain.results]
            e = s.experts["verify"]
            t_verify = s.target_time_s / s.decode_forwards
            t_draft = s.draft_time_s / max(1, s.draft_forwards)
            acc = s.acceptance_per_position
            pred = predicted_speedup(cfg, vocab, b, k, acc, plain_experts, e["distinct_experts"], context,
                                     bandwidth, gen.target.dtype.itemsize)
            rows.append({
                "model": path, "style": cfg.mtp.style, "batch": b, "k": k, "identical": same,
                "plain_tokens_per_s": plain_tps, "spec_tokens_per_s": s.decode_tokens / spec_s,
                "measured_speedup": (s.decode_tokens / spec_s) / plain_tps,
                "predicted_bytes": pred["speedup"],
                "predicted_timed": s.mean_accept_length * t_plain / (t_verify + k * t_draft),
                "tokens_per_round": s.mean_accept_length, "acceptance_per_position": acc,
                "sequences_per_forward": s.sequences_per_forward,
                "verify_experts": e["distinct_experts"], "plain_experts": plain_experts,
                "verify_over_plain_experts": e["distinct_experts"] / plain_experts,
                "uniform_verify_over_plain": e["uniform_expectation"] / plain.stats.experts["plain"][
                    "uniform_expectation"],
                "t_plain_ms": 1e3 * t_plain, "t_verify_ms": 1e3 * t_verify, "t_draft_ms": 1e3 * t_draft,
                "plain_bytes": pred["plain_bytes"], "verify_bytes": pred["verify_bytes"],
            })
    return rows


def run(argv: list[str] | None = None) -> dict:
    args = _parse_args(argv)
    batches, ks = _ints(args.batches, "--batches"), _ints(args.ks, "--ks")
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args.prompts)]
    bandwidth = cpu_read_bandwidth()
    rows = [row for model in args.models
            for row in bench_model(model, batches, ks, prompts, args.max_new_tokens, args.repeats, bandwidth)]
    print(f"CPU read bandwidth {bandwidth / 1e9:.1f} GB/s (1 thread), {len(prompts)} prompts × "
          f"{args.max_new_tokens} new tokens, greedy, best of {args.repeats}, "
          f"threads {os.environ.get('OMP_NUM_THREADS')}")
    print(f"{'style':>10} {'B':>3} {'K':>2} {'plain tok/s':>11} {'spec tok/s':>10} {'measured':>8} "
          f"{'pred(timed)':>11} {'pred(bytes)':>11} {'tok/round':>9} {'seq/fwd':>7} {'experts verify/plain':>20} "
          f"{'uniform':>7} {'same':>4}  acceptance per position")
    for r in rows:
        acc = " ".join(f"{a:.2f}" for a in r["acceptance_per_position"])
        print(f"{r['style']:>10} {r['batch']:>3} {r['k']:>2} {r['plain_tokens_per_s']:>11.1f} "
              f"{r['spec_tokens_per_s']:>10.1f} {r['measured_speedup']:>8.2f} {r['predicted_timed']:>11.2f} "
              f"{r['predicted_bytes']:>11.2f} {r['tokens_per_round']:>9.2f} {r['sequences_per_forward']:>7.1f} "
              f"{r['verify_experts']:>6.2f}/{r['plain_experts']:<5.2f}={r['verify_over_plain_experts']:>5.2f} "
              f"{r['uniform_verify_over_plain']:>7.2f} {'yes' if r['identical'] else 'NO':>4}  {acc}")
    report = {"bandwidth_bytes_per_s": bandwidth, "prompts": len(prompts), "max_new_tokens": args.max_new_tokens,
              "repeats": args.repeats, "rows": rows}
    if args.json:
        write_json(args.json, report)
    return report


def main(argv: list[str] | None = None) -> int:
    return cli_main("bench_batched_decode", run, argv)


if __name__ == "__main__":
    sys.exit(main())
