"""MTP for a model that already exists: MTP-only training (mtp.freeze_base) of each init × each target on
the default model's main weights, beside the jointly trained default model.

    python tools/compare_mtp_only.py [--config configs/tiny_cpu.yaml] [--steps 300] [--out runs/compare_mtp_only]
        [--eval-steps 16] [--new-tokens 64] [--threads 1] [--reuse] [--variants random-tokens,copy_last_layer-self,...]

1. The default model (configs/tiny_cpu.yaml, or --config, e.g. configs/qwen3_moe_tiny_cpu.yaml; MTP D=1)
   is trained jointly for --steps steps ("joint").
2. Its main weights are exported with `convert to-hf --mtp none` and imported back (`convert from-hf`):
   a model without MTP weights (num_nextn_predict_layers 0).
3. From that import, MTP-only training for the same steps, same data order and LR schedule, for each
   mtp.init (random, copy_last_layer) × mtp.targets (tokens, self, mix at self_weight 0.5).
4. Each run (and the joint model): `megatron-mtp eval --json` on held-out global batches of the default
   corpus (teacher-forced acceptance and MTP loss against the data tokens), and greedy speculative decoding
   of its fp32 export on the held-out prompts of tools/bench/bench_speculative.py at K = 1..3 (mean accept
   length = tokens per verification round; each output checked equal to plain greedy decoding), with
   the helpers of tools/compare_mtp_styles.py.
Prints a markdown table and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from compare_mtp_styles import CONFIG, TRAIN_OVERRIDES, _cli, evaluate, speculative, step_time  # noqa: E402

VARIANTS = [f"{init}-{target}" for init in ("random", "copy_last_layer") for target in ("tokens", "self", "mix")]


def _train(run: Path, overrides: list[str], steps: int, threads: int, reuse: bool,
           config: str = str(CONFIG)) -> None:
    if reuse and (run / "checkpoints" / "latest").is_file():
        return
    shutil.rmtree(run, ignore_errors=True)
    _cli(["train", config, "--run-dir", str(run), "--max-steps", str(steps), *TRAIN_OVERRIDES,
          "checkpoint.save_interval=0", *overrides], threads)


def base_without_mtp(joint: Path, out: Path, threads: int, reuse: bool) -> Path:
    """The joint model's main weights, exported with --mtp none and imported back."""
    hf, ckpt = out / "base_hf", out / "base_ckpt"
    if reuse and (ckpt / "config.yaml").is_file():
        return ckpt
    shutil.rmtree(hf, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    _cli(["convert", "to-hf", str(joint), str(hf), "--mtp", "none", "--dtype", "fp32"], threads)
    _cli(["convert", "from-hf", str(hf), str(ckpt)], threads)
    return ckpt


def summary(run: Path, eval_steps: int, new_tokens: int, threads: int) -> dict:
    median_step, last = step_time(run)
    return {"train_step_time_s": median_step, "train_mtp_loss": last.get("train/mtp_loss_1"),
            "eval": evaluate(run, eval_steps, threads), "speculative": speculative(run, 1, "sequential", new_tokens)}


def table(results: dict) -> str:
    lines = ["| variant | init | targets | valid MTP loss (to tokens) | teacher-forced acceptance | "
             "accept length K=1 / 2 / 3 | step time (s) |", "|---|---|---|---|---|---|---|"]
    for name, r in results.items():
        init, target = ("joint", "tokens") if name == "joint" else name.split("-")
        spec = r["speculative"]
        lengths = " / ".join(f"{spec[k]['accept_length']:.3f}" for k in sorted(spec, key=int))
        same = all(s["same_as_plain"] for s in spec.values())
        lines.append(f"| {'joint (default model)' if name == 'joint' else 'MTP only'} | {init} | {target} | "
                     f"{r['eval']['mtp_loss'][0]:.4f} | {r['eval']['mtp_acceptance'][0]:.3f} | "
                     f"{lengths}{'' if same else ' (differs from greedy!)'} | {r['train_step_time_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(CONFIG), help="the model (its MTP depth 1)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--out", default=str(ROOT / "runs" / "compare_mtp_only"))
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated of {', '.join(VARIANTS)}")
    parser.add_argument("--eval-steps", type=int, default=16)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    joint = out / "joint"
    _train(joint, [], args.steps, args.threads, args.reuse, args.config)
    base = base_without_mtp(joint, out, args.threads, args.reuse)
    results = {"joint": summary(joint, args.eval_steps, args.new_tokens, args.threads)}
    print("joint done", flush=True)
    for name in args.variants.split(","):
        init, target = name.split("-")
        run = out / name
        _train(run, [f"checkpoint.load={base}", "checkpoint.load_optimizer=false", "mtp.freeze_base=true",
                     f"mtp.init={init}", f"mtp.targets={target}"], args.steps, args.threads, args.reuse, args.config)
        results[name] = summary(run, args.eval_steps, args.new_tokens, args.threads)
        print(f"{name}: acceptance {results[name]['eval']['mtp_acceptance'][0]:.3f}", flush=True)
    print()
    print(table(results))
    record = {"config": args.config, "steps": args.steps, "variants": results}
    (out / "results.json").write_text(json.dumps(record, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
