"""Benchmark: what the FP8 export (DeepSeek-V3's release format) costs against the bf16 export.

    python tools/bench/bench_fp8_export.py [--workdir DIR] [--steps 300] [--reuse] [--json OUT]

Two models are trained by the real trainer on the default corpus (configs/tiny_cpu.yaml, same seed and
data): the default model, and one whose every FP8 weight dimension is a multiple of 128 ("aligned":
hidden 256, q_lora 128, kv_lora 64 + rope 64, heads of 64 + 64, expert FFN 128), so its 128x128
blocks are never partial. For each, side by side in one run:

- export: to-hf --mtp separate in bf16 and in fp8, alternating, best of 3; size of the safetensors
  written and wall time, as fp8 / bf16 ratios;
- held-out loss: each export imported back (``from-hf``, fp32: the FP8 blocks dequantised exactly) and
  evaluated by ``megatron-mtp eval`` on the validation split of the default corpus (never trained on;
  16 batches of 8 x 128 tokens); the largest |logit| difference, main and MTP, between the two
  imports on the 8 held-out prompts of bench_speculative.py;
- acceptance: ``generate --speculative K`` (K = 1, 2, 3; the one MTP module chained) on those prompts,
  64 new tokens each, greedy and at temperature 1 (seed per prompt), for bf16 main + bf16 MTP, FP8 main +
  bf16 MTP (main/ of the fp8 export, mtp/ of the bf16 one) and FP8 main + FP8 MTP: mean accept length
  and pooled acceptance.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools" / "bench"))

CONFIG = ROOT / "configs" / "tiny_cpu.yaml"
MODELS = {
    "default": [],
    "aligned": ["model.hidden_size=256", "model.ffn_hidden_size=768", "model.q_lora_rank=128",
                "model.kv_lora_rank=64", "model.qk_head_dim=64", "model.qk_pos_emb_head_dim=64",
                "model.v_head_dim=64", "model.moe_ffn_hidden_size=128"],
}
# the HF format scores a routing group by its top-2 experts (convert/README.md)
TRAIN_OVERRIDES = ["model.router_group_topk=1", "logging.tensorboard=false", "logging.eval_interval=0"]
# the validation split of the embedded default corpus, which brings its own tokenizer (the same as the export's)
EVAL_OVERRIDES = ["training.seq_length=128", "training.micro_batch_size=8", "data.tokenizer=null"]
VARIANTS = ("bf16 main + bf16 MTP", "FP8 main + bf16 MTP", "FP8 main + FP8 MTP")


def _env() -> dict:
    return dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", MEGATRON_MTP_NO_PROGRESS="1",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cli(args: list[str]) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"megatron-mtp {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return proc


def _size(out: Path) -> int:
    return sum(f.stat().st_size for f in out.rglob("*.safetensors"))


def exports(run: Path, work: Path) -> dict:
    """bf16 and fp8 exports of the run (kept: the fastest of 3 runs' output), with sizes and times."""
    from megatron_mtp.convert.to_hf import export_to_hf

    best = {}
    for attempt in range(3):
        for dtype in ("bf16", "fp8"):
            out = work / f"{dtype}.{attempt}"
            shutil.rmtree(out, ignore_errors=True)
            start = time.perf_counter()
            export_to_hf(run, out, mtp="separate", dtype=dtype)
            os.sync()
            seconds = time.perf_counter() - start
            if dtype not in best or seconds < best[dtype][0]:
                if dtype in best:
                    shutil.rmtree(best[dtype][1])
                best[dtype] = (seconds, out)
            else:
                shutil.rmtree(out)
    result = {}
    for dtype, (seconds, out) in best.items():
        final = work / dtype
        shutil.rmtree(final, ignore_errors=True)
        out.rename(final)
        result[dtype] = {"seconds": seconds, "bytes": _size(final), "dir": str(final)}
    return result


def _prompt_tokens(tokenizer_file: Path):
    import torch
    from bench_speculative import HELD_OUT_PROMPTS
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file))
    ids = [tok.encode(p).ids for p in HELD_OUT_PROMPTS]
    n = min(len(i) for i in ids)
    return torch.tensor([i[:n] for i in ids])


def quality(work: Path, dirs: dict) -> dict:
    """Held-out loss of each export (imported back) and the largest logit differences between them."""
    import torch

    from megatron_mtp.convert.from_hf import import_from_hf

    tokens = work / "tokens.pt"
    torch.save(_prompt_tokens(Path(dirs["bf16"]) / "main" / "tokenizer.json"), tokens)
    result, logits = {}, {}
    for dtype in ("bf16", "fp8"):
        ckpt = work / f"ckpt_{dtype}"
        shutil.rmtree(ckpt, ignore_errors=True)
        import_from_hf(dirs[dtype], ckpt)
        proc = _cli(["eval", str(ckpt), "--json", "--steps", "16", *EVAL_OVERRIDES])
        result[dtype] = json.loads(proc.stdout.strip().splitlines()[-1])
        out = work / f"logits_{dtype}.pt"
        subprocess.run([sys.executable, str(ROOT / "tests" / "dist" / "scripts" / "forward_logits.py"), str(ckpt),
                        str(tokens), str(out)],
                       cwd=ROOT, env=_env(), check=True, capture_output=True)
        logits[dtype] = torch.load(out)
        shutil.rmtree(ckpt)
    a, b = logits["bf16"], logits["fp8"]
    result["max_logit_diff"] = (a["logits"] - b["logits"]).abs().max().item()
    result["max_mtp_logit_diff"] = max((x - y).abs().max().item() for x, y in zip(a["mtp_logits"], b["mtp_logits"]))
    result["logit_scale"] = a["logits"].abs().max().item()
    return result


def acceptance(work: Path, dirs: dict, new_tokens: int) -> dict:
    from bench_speculative import HELD_OUT_PROMPTS

    from megatron_mtp.inference.generate import load_generator

    mixed = work / "fp8_main_bf16_mtp"
    shutil.rmtree(mixed, ignore_errors=True)
    mixed.mkdir()
    (mixed / "main").symlink_to(Path(dirs["fp8"]) / "main")
    (mixed / "mtp").symlink_to(Path(dirs["bf16"]) / "mtp")
    sources = dict(zip(VARIANTS, (dirs["bf16"], mixed, dirs["fp8"])))
    result = {}
    for variant, model in sources.items():
        gen = load_generator(str(model))
        for temperature in (0.0, 1.0):
            for k in (1, 2, 3):
                rounds = round_tokens = accepted = reached = 0
                for seed, prompt in enumerate(HELD_OUT_PROMPTS):
                    s = gen.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True, speculative_k=k,
                                     temperature=temperature, seed=seed).stats
                    rounds += s.rounds
                    round_tokens += s.round_tokens
                    accepted += sum(s.accepted)
                    reached += sum(s.reached)
                result[f"{variant}|{temperature:g}|{k}"] = {"accept_length": round_tokens / max(rounds, 1),
                                                            "acceptance": accepted / max(reached, 1)}
    return result


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", default=str(ROOT / "runs" / "bench_fp8_export"))
    parser.add_argument("--steps", type=int, default=300, help="training steps per model (default 300)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--reuse", action="store_true", help="keep runs already trained in --workdir")
    parser.add_argument("--models", default="default,aligned")
    parser.add_argument("--json", help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    os.environ["MEGATRON_MTP_NO_PROGRESS"] = "1"
    work = Path(args.workdir)
    work.mkdir(parents=True, exist_ok=True)
    report = {}
    for name in args.models.split(","):
        run = work / name / "run"
        if not (args.reuse and (run / "checkpoints" / "latest").is_file()):
            shutil.rmtree(run, ignore_errors=True)
            _cli(["train", str(CONFIG), "--run-dir", str(run), "--max-steps", str(args.steps), *TRAIN_OVERRIDES,
                  *MODELS[name]])
        dirs = exports(run, work / name)
        report[name] = {"export": dirs,
                        "quality": quality(work / name, {d: v["dir"] for d, v in dirs.items()}),
                        "acceptance": acceptance(work / name, {d: v["dir"] for d, v in dirs.items()},
                                                 args.new_tokens)}
        print(f"[{name} done]", file=sys.stderr, flush=True)
    for name, r in report.items():
        e, q = r["export"], r["quality"]
        print(f"\n== {name} model ({args.steps} steps) ==")
        print(f"export  bf16 {e['bf16']['bytes'] / 1e6:.2f} MB {e['bf16']['seconds']:.2f} s | fp8 "
              f"{e['fp8']['bytes'] / 1e6:.2f} MB {e['fp8']['seconds']:.2f} s | fp8/bf16 size "
              f"{e['fp8']['bytes'] / e['bf16']['bytes']:.3f}, time {e['fp8']['seconds'] / e['bf16']['seconds']:.2f}")
        print(f"held-out LM loss  bf16 {q['bf16']['lm_loss']:.4f}  fp8 {q['fp8']['lm_loss']:.4f}  "
              f"(diff {q['fp8']['lm_loss'] - q['bf16']['lm_loss']:+.4f}); MTP loss bf16 {q['bf16']['mtp_loss'][0]:.4f} "
              f"fp8 {q['fp8']['mtp_loss'][0]:.4f}")
        print(f"largest |logit| difference fp8 vs bf16: main {q['max_logit_diff']:.4f}, MTP "
              f"{q['max_mtp_logit_diff']:.4f} (largest |logit| {q['logit_scale']:.2f})")
        print(f"{'variant':<22}{'T':>3}  accept length K=1 / 2 / 3      acceptance K=1 / 2 / 3")
        for variant in VARIANTS:
            for t in ("0", "1"):
                rows = [r["acceptance"][f"{variant}|{t}|{k}"] for k in (1, 2, 3)]
                print(f"{variant:<22}{t:>3}  " + " / ".join(f"{x['accept_length']:.3f}" for x in rows) + "    "
                      + " / ".join(f"{x['acceptance']:.3f}" for x in rows))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
