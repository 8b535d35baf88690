"""Compare the four MTP designs drafting for one frozen target: DeepSeek's sequential modules, Gloeckle's
parallel heads, Gemma 4's assistant and EAGLE-3.

    python tools/compare_drafters.py [--target-steps 300] [--steps 300] [--out runs/compare_drafters]
        [--eval-steps 16] [--new-tokens 64] [--threads 2] [--reuse] [--only NAME ...] [--no-decode NAME ...]

A tiny Gemma 4 target (configs/gemma4_tiny_cpu.yaml without MTP: 4 layers of width 128, sliding windows of
32, 8 experts) trains once; then each drafter trains on it frozen (mtp.freeze_base), from the same seed, for
the same steps of the same data (mtp.targets=tokens: the data tokens ahead, for the first three):
  - sequential D=3: three modules of the target's width (a transformer layer of the target's kind each,
    eh_proj, norms), sharing the target's embedding and output head, each layer copied from the target's last;
  - parallel D=3: three heads on the target's final hidden state (a transformer layer of the MTP kind and a
    norm each, copied alike), sharing the output head; each drafts one position, so K <= 3;
  - assistant K=6: one assistant of width 64 (2 query-only layers over the target's stored keys/values, its
    own 4,096 x 64 output table) applied 6 times;
  - EAGLE-3 K=6: one dense decoder layer at the target's width 128 (the design fixes it: the layer reads
    [embedding ; hidden]) over fc of the target's hidden states after its layers 1, 2 and 3, a head over a
    draft vocabulary of the 2,048 most frequent tokens (2,048 x 128: as many weights as the assistant's table),
    trained 6 steps deep (training-time test) with its own objective, the KL to the target's distribution.
Per drafter:
  - held-out acceptance per draft step (``megatron-mtp eval RUN --json``: teacher-forced, the drafter's
    argmax against the target's, on the default corpus' validation split), trained and untrained (the drafter
    as it starts, saved by one step at learning rate 0: a random assistant or EAGLE-3 layer, the target's last
    layer copied for modules and heads);
  - greedy speculative decoding of the exported drafter on the held-out prompts of
    tools/bench/bench_speculative.py at K = 1..D: tokens per verification round, checked equal to plain
    greedy decoding (``--no-decode NAME``: left "not measured", for a style with no decoder);
  - draft cost per drafted token: the weights one draft step reads at batch 1 (its own tensors, the shared
    output head for sequential modules and heads, routed experts: the top-k; EAGLE-3's fc, which runs once per
    round, shared out over its 6 steps), beside the target's per decoded token, as `plan --speculative` counts
    them (the style's plan ``draft_step_bytes``; parallel heads, which do not draft there: as a module's step).
Prints a markdown table and writes OUT/results.json (with ``--reuse``, the results of drafters ``--only`` leaves
out stay as the file has them).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "gemma4_tiny_cpu.yaml"
COMMON = ["logging.eval_interval=0", "checkpoint.save_interval=0", "logging.tensorboard=false"]
DRAFTERS = {
    "sequential": ("sequential D=3", 3, ["mtp.style=sequential", "mtp.num_layers=3", "mtp.init=copy_last_layer"]),
    "parallel": ("parallel D=3", 3, ["mtp.style=parallel", "mtp.num_layers=3", "mtp.init=copy_last_layer"]),
    "assistant": ("assistant K=6", 6, ["mtp.style=assistant", "mtp.num_layers=6", "mtp.assistant.hidden_size=64",
                                       "mtp.assistant.num_layers=2", "mtp.assistant.num_attention_heads=4",
                                       "mtp.assistant.ffn_hidden_size=128",
                                       "mtp.assistant.layer_types=[sliding_attention,full_attention]"]),
    "eagle3": ("EAGLE-3 K=6", 6, ["mtp.style=eagle3", "mtp.num_layers=6", "mtp.eagle3.num_layers=1",
                                  "mtp.eagle3.aux_layers=[1,2,3]", "mtp.eagle3.draft_vocab_size=2048"]),
}
UNTRAINED = ["optimizer.lr=0", "optimizer.min_lr=0", "checkpoint.save_interval=1"]
"""The drafter as it starts: one step at learning rate 0 saves it unchanged (training.max_steps must be >= 1)."""
FROZEN = ["mtp.freeze_base=true", "mtp.targets=tokens", "checkpoint.load_optimizer=false", "checkpoint.save_interval=0"]


def _cli(args: list[str], threads: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", MEGATRON_MTP_NO_PROGRESS="1")
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"megatron-mtp {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _train(run: Path, steps: int, overrides: list[str], threads: int, reuse: bool) -> None:
    if reuse and (run / "checkpoints" / "latest").is_file():
        return
    shutil.rmtree(run, ignore_errors=True)
    _cli(["train", str(CONFIG), "--run-dir", str(run), "--max-steps", str(steps), *COMMON, *overrides], threads)


def draft_weights(run: Path) -> tuple[float, float]:
    """(weights one draft step reads per sequence, weights the target reads per decoded token), in elements, as
    `plan --speculative` counts them at batch 1 (routed experts: the top-k a token picks)."""
    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.config.mtp_style import get_style
    from megatron_mtp.config.vocab import resolve_vocab
    from megatron_mtp.plan.speculative import ServeLayout, draft_step_bytes, main_forward_bytes

    cfg = read_config(resolve_checkpoint(run).path)
    vocab, serve = resolve_vocab(cfg), ServeLayout(weight_bytes=1.0, context=1)
    target = main_forward_bytes(cfg, vocab, 1, 1, serve)
    step = getattr(get_style(cfg.mtp.style).plan(), "draft_step_bytes", draft_step_bytes)(cfg, vocab, 1, serve)
    return step.dense + step.experts, target.dense + target.experts


def speculative(export: Path, depth: int, new_tokens: int) -> dict:
    """Tokens per round at K = 1..depth over the held-out prompts, and whether every output is plain greedy's."""
    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    from bench_speculative import HELD_OUT_PROMPTS

    from megatron_mtp.inference.generate import load_generator

    gen = load_generator(export)
    plain = {p: gen.generate(p, max_new_tokens=new_tokens, ignore_eos=True).tokens for p in HELD_OUT_PROMPTS}
    out = {}
    for k in range(1, depth + 1):
        rounds = tokens = 0
        same = True
        for prompt in HELD_OUT_PROMPTS:
            r = gen.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True, speculative_k=k)
            same &= r.tokens == plain[prompt]
            rounds, tokens = rounds + r.stats.rounds, tokens + r.stats.round_tokens
        out[k] = {"tokens_per_round": tokens / max(rounds, 1), "same_as_plain": same}
    return out


def _eval(run: Path, eval_steps: int, threads: int) -> list[float]:
    """Held-out acceptance per draft step (`megatron-mtp eval RUN --json`)."""
    out = _cli(["eval", str(run), "--json", "--steps", str(eval_steps)], threads).stdout
    return json.loads(out.strip().splitlines()[-1])["mtp_acceptance"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--target-steps", type=int, default=300)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default=str(ROOT / "runs" / "compare_drafters"))
    ap.add_argument("--eval-steps", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    ap.add_argument("--only", nargs="+", choices=list(DRAFTERS), default=list(DRAFTERS),
                    help="the drafters to train and measure (default: all four); with --reuse the others' results "
                         "stay as OUT/results.json has them")
    ap.add_argument("--no-decode", nargs="*", choices=list(DRAFTERS), default=[],
                    help="drafters whose tokens per round are left unmeasured (a style with no decoder yet)")
    args = ap.parse_args()
    out = Path(args.out)
    target = out / "target"
    print(f"target: {args.target_steps} steps", file=sys.stderr, flush=True)
    _train(target, args.target_steps, ["mtp.num_layers=0", "checkpoint.save_interval=" + str(args.target_steps)],
           args.threads, args.reuse)
    done = out / "results.json"
    results = json.loads(done.read_text()) if args.reuse and done.is_file() else {}
    for name in args.only:
        title, depth, overrides = DRAFTERS[name]
        run, untrained = out / name, out / f"{name}_untrained"
        print(f"{title}: {args.steps} steps on the frozen target", file=sys.stderr, flush=True)
        _train(run, args.steps, [*overrides, *FROZEN, f"checkpoint.load={target}",
                                 f"checkpoint.save_interval={args.steps}"], args.threads, args.reuse)
        _train(untrained, 1, [*overrides, *FROZEN, f"checkpoint.load={target}", *UNTRAINED], args.threads, args.reuse)
        export = run / "hf"
        if not export.exists():
            _cli(["convert", "to-hf", str(run), str(export), "--dtype", "fp32"], args.threads)
        draft, main_weights = draft_weights(run)
        decoding = None if name in args.no_decode else speculative(export, depth, args.new_tokens)
        results[name] = {"title": title, "acceptance": _eval(run, args.eval_steps, args.threads),
                         "untrained_acceptance": _eval(untrained, args.eval_steps, args.threads),
                         "draft_elements": draft, "target_elements": main_weights, "decoding": decoding}
    results = {name: results[name] for name in DRAFTERS if name in results}
    done.write_text(json.dumps(results, indent=2) + "\n")
    print("| drafter | held-out acceptance, step 1..K (untrained) | tokens per round at K = 1..K | draft weights per "
          "drafted token (vs the target's per token) | outputs = plain greedy |")
    print("|---|---|---|---|---|")
    for r in results.values():
        acc = " / ".join(f"{a:.2f}" for a in r["acceptance"])
        untrained = " / ".join(f"{a:.2f}" for a in r["untrained_acceptance"])
        tpr = same = "not measured"
        if r["decoding"] is not None:
            tpr = " / ".join(f"{d['tokens_per_round']:.2f}" for d in r["decoding"].values())
            same = str(all(d["same_as_plain"] for d in r["decoding"].values()))
        print(f"| {r['title']} | {acc} ({untrained}) | {tpr} | {r['draft_elements'] / 1e6:.2f} M "
              f"({r['draft_elements'] / r['target_elements']:.2f}) | {same} |")
    return 0

if __name__ == "__main__":
    raise SystemExit(main())
