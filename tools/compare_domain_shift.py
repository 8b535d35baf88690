"""A domain shift: the main model fine-tuned on English prose without its MTP module, the acceptance of
the stale draft there, and its recovery after MTP-only training on that prose.

    python tools/compare_domain_shift.py [--joint runs/compare_mtp_only/joint] [--out runs/compare_domain_shift]
        [--steps 300] [--threads 1]

1. A second corpus built offline: the docstrings of the Python standard library (English prose; the
   default corpus is its code), one document each; every 20th (by CRC32 of its text) is held out as
   the evaluation text.
2. The jointly trained default model (tools/compare_mtp_only.py's "joint") is fine-tuned on it for
   --steps steps without MTP (mtp.num_layers=0, weights-only load).
3. The stale draft: the fine-tuned main weights (`to-hf --mtp none`) paired with the joint model's MTP
   module (`to-hf --mtp only`) by `from-hf --mtp-dir`.
4. MTP-only training of that draft on the prose (mtp.freeze_base, mtp.targets=self), --steps steps.
5. `megatron-mtp eval --text-file` on the held-out prose (and the default corpus's held-out split for
   the joint model): teacher-forced acceptance per model.
Prints a markdown table and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import sys
import sysconfig
import zlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

from compare_mtp_styles import CONFIG, TRAIN_OVERRIDES, _cli  # noqa: E402


def build_prose(out: Path) -> tuple[Path, Path]:
    """(training JSONL, held-out text) of the standard library's docstrings."""
    train, valid = out / "prose_train.jsonl", out / "prose_valid.txt"
    if train.is_file() and valid.is_file():
        return train, valid
    docs = []
    for path in sorted(Path(sysconfig.get_paths()["stdlib"]).rglob("*.py")):
        if "test" in path.parts or "site-packages" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in [tree, *ast.walk(tree)]:
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 200:
                    docs.append(doc)
    held = [d for d in docs if zlib.crc32(d.encode()) % 20 == 0]
    with train.open("w", encoding="utf-8") as fh:
        for d in docs:
            if zlib.crc32(d.encode()) % 20:
                fh.write(json.dumps({"text": d}) + "\n")
    valid.write_text("\n\n".join(held), encoding="utf-8")
    return train, valid


def _latest(run: Path) -> Path:
    return run / "checkpoints" / (run / "checkpoints" / "latest").read_text().strip()


def _eval(path: Path, threads: int, text: Path | None = None) -> dict:
    args = ["eval", str(path), "--json"] + (["--text-file", str(text)] if text else ["--steps", "16"])
    return json.loads(_cli(args, threads).stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--joint", default=str(ROOT / "runs" / "compare_mtp_only" / "joint"))
    parser.add_argument("--out", default=str(ROOT / "runs" / "compare_domain_shift"))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    out, joint, t = Path(args.out), Path(args.joint), args.threads
    out.mkdir(parents=True, exist_ok=True)
    train_jsonl, valid_text = build_prose(out)
    tokenizer = _latest(joint) / "tokenizer"
    prefix = out / "prose"
    _cli(["preprocess", "--input", str(train_jsonl), "--tokenizer", str(tokenizer), "--output-prefix", str(prefix),
          "--no-progress"], t)
    data = [f"data.paths=[{prefix}]", f"data.tokenizer={tokenizer}"]
    for name in ("finetuned", "ft_hf", "old_draft", "stale", "recovered"):
        shutil.rmtree(out / name, ignore_errors=True)
    common = ["--max-steps", str(args.steps), *TRAIN_OVERRIDES, *data, "checkpoint.load_optimizer=false"]
    _cli(["train", str(CONFIG), "--run-dir", str(out / "finetuned"), *common, "mtp.num_layers=0",
          f"checkpoint.load={joint}"], t)
    _cli(["convert", "to-hf", str(out / "finetuned"), str(out / "ft_hf"), "--mtp", "none", "--dtype", "fp32"], t)
    _cli(["convert", "to-hf", str(joint), str(out / "old_draft"), "--mtp", "only", "--dtype", "fp32"], t)
    _cli(["convert", "from-hf", str(out / "ft_hf"), str(out / "stale"), "--mtp-dir", str(out / "old_draft")], t)
    _cli(["train", str(CONFIG), "--run-dir", str(out / "recovered"), *common, "mtp.num_layers=1",
          "mtp.freeze_base=true", "mtp.targets=self", f"checkpoint.load={out / 'stale'}"], t)
    rows = {
        "joint model, code (default corpus held-out split)": _eval(joint, t),
        "joint model, prose": _eval(joint, t, valid_text),
        "fine-tuned on prose + stale draft, prose": _eval(out / "stale", t, valid_text),
        "fine-tuned on prose + MTP-only retrained draft, prose": _eval(out / "recovered", t, valid_text),
    }
    lines = ["| model, evaluated on | LM loss | MTP loss (to tokens) | teacher-forced acceptance |",
             "|---|---|---|---|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['lm_loss']:.4f} | {r['mtp_loss'][0]:.4f} | {r['mtp_acceptance'][0]:.3f} |")
    print("\n".join(lines))
    (out / "results.json").write_text(json.dumps({"steps": args.steps, "rows": rows}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
