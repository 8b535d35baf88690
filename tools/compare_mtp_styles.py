"""Compare no MTP, DeepSeek's sequential MTP and Gloeckle's parallel heads on the same model, data and layout.

    python tools/compare_mtp_styles.py [--steps 300] [--out runs/compare_mtp_styles] [--variants d0,seq2,par2,par3]
        [--eval-steps 16] [--new-tokens 64] [--threads 1] [--reuse] [--no-memory]

Each variant trains the default model (configs/tiny_cpu.yaml: 4 layers, MLA, 8 experts) from the same seed
for the same steps, i.e. the same tokens in the same order (the data order does not depend on the model),
with one process and no evaluation or checkpoint inside the timed steps. Then, per variant:
  - validation loss of the main model and, per depth k, the MTP loss and the teacher-forced acceptance
    (``megatron-mtp eval RUN --json --steps N``: held-out global batches of the default corpus's
    validation split, never trained on);
  - export (``convert to-hf``, fp32) and greedy speculative decoding with the exported drafts on the
    built-in held-out prompts of tools/bench/bench_speculative.py: mean accept length (tokens per
    verification round) and acceptance per draft position at K = 1..3 (parallel heads draft at most
    K = n), checking that every output equals plain greedy decoding;
  - step time: short runs of every variant in turn, repeated ``--timing-rounds`` times (interleaved, so
    that the load of a shared machine falls on all variants alike); per run the median of its logged
    10-step intervals after the first (``perf/step_time_s``), then the fastest round.
Gloeckle's memory-saving order is measured separately for the parallel variants (``--no-memory``
skips it): the peak bytes of tensors autograd saves during one training micro-batch's forward
(parameters and repeated views of a storage not counted), what is still held when the backward
starts, and the fastest forward+backward, all heads at once vs head by head alternating on one model.
Prints markdown tables and writes OUT/results.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from contextlib import nullcontext
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "configs" / "tiny_cpu.yaml"
VARIANTS = {
    "d0": ("no MTP", ["mtp.num_layers=0"]),
    "seq2": ("sequential D=2", ["mtp.style=sequential", "mtp.num_layers=2"]),
    "par2": ("parallel n=2", ["mtp.style=parallel", "mtp.num_layers=2"]),
    "par3": ("parallel n=3", ["mtp.style=parallel", "mtp.num_layers=3"]),
}
# runs whose step times compare: no evaluation or saving between the timed steps (the default λ schedule,
# 0.3 for the first 2M tokens, then 0.1)
TRAIN_OVERRIDES = ["logging.eval_interval=0", "checkpoint.save_interval=0", "logging.tensorboard=false"]


def _env(threads: int) -> dict:
    return dict(os.environ, OMP_NUM_THREADS=str(threads), PYTHONWARNINGS="ignore", MEGATRON_MTP_NO_PROGRESS="1",
                PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _cli(args: list[str], threads: int) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", *args], cwd=ROOT, env=_env(threads),
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"megatron-mtp {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n"
                         f"{proc.stderr[-4000:]}")
    return proc


def train(run: Path, overrides: list[str], steps: int, threads: int, reuse: bool) -> float:
    """Train (or reuse) one variant; the wall time of the training command."""
    if reuse and (run / "checkpoints" / "latest").is_file():
        return float("nan")
    shutil.rmtree(run, ignore_errors=True)
    start = time.perf_counter()
    _cli(["train", str(CONFIG), "--run-dir", str(run), "--max-steps", str(steps), *TRAIN_OVERRIDES, *overrides],
         threads)
    return time.perf_counter() - start


def step_time(run: Path) -> tuple[float, dict]:
    rows = [json.loads(line) for line in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "perf/step_time_s" in r]
    times = [r["perf/step_time_s"] for r in rows[1:]] or [rows[0]["perf/step_time_s"]]
    return statistics.median(times), rows[-1]


def evaluate(run: Path, eval_steps: int, threads: int) -> dict:
    proc = _cli(["eval", str(run), "--json", "--steps", str(eval_steps)], threads)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def speculative(run: Path, depth: int, style: str, new_tokens: int) -> dict:
    """Greedy accept length and per-position acceptance at K = 1..3 over the held-out prompts."""
    import torch

    sys.path.insert(0, str(ROOT / "tools" / "bench"))
    from bench_speculative import HELD_OUT_PROMPTS

    from megatron_mtp.convert.to_hf import export_to_hf
    from megatron_mtp.inference.generate import load_generator

    torch.set_num_threads(1)
    out = run / "hf"
    if not out.exists():
        export_to_hf(run, out, mtp="separate", dtype="fp32")
    gen = load_generator(out)
    plain = {p: gen.generate(p, max_new_tokens=new_tokens, ignore_eos=True).tokens for p in HELD_OUT_PROMPTS}
    result = {}
    for k in (1, 2, 3):
        if style == "parallel" and k > depth:
            continue
        rounds = round_tokens = 0
        accepted, reached = [0] * k, [0] * k
        same = True
        for prompt in HELD_OUT_PROMPTS:
            r = gen.generate(prompt, max_new_tokens=new_tokens, ignore_eos=True, speculative_k=k)
            same &= r.tokens == plain[prompt]
            s = r.stats
            rounds += s.rounds
            round_tokens += s.round_tokens
            for i in range(k):
                accepted[i] += s.accepted[i] if i < len(s.accepted) else 0
                reached[i] += s.reached[i] if i < len(s.reached) else 0
        result[k] = {"accept_length": round_tokens / max(rounds, 1),
                     "acceptance_per_position": [a / max(n, 1) for a, n in zip(accepted, reached)],
                     "same_as_plain": same}
    return result


# -- Gloeckle's memory-saving order ------------------------------------------------------------------


class SavedTensorBytes:
    """Live and peak bytes of the storages autograd keeps for backward (parameters excluded)."""

    def __init__(self, params):
        self.params = {p.untyped_storage().data_ptr() for p in params}
        self.live: dict[int, list[int]] = {}
        self.current = self.peak = 0

    def pack(self, tensor):
        storage = tensor.untyped_storage()
        key = storage.data_ptr()
        if key in self.params or tensor.device.type == "meta":
            return tensor
        entry = self.live.get(key)
        if entry is None:
            self.live[key] = [1, storage.nbytes()]
            self.current += storage.nbytes()
            self.peak = max(self.peak, self.current)
        else:
            entry[0] += 1
        return _Saved(self, key, tensor)

    @staticmethod
    def unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def release(self, key: int) -> None:
        entry = self.live[key]
        entry[0] -= 1
        if entry[0] == 0:
            self.current -= entry[1]
            del self.live[key]


class _Saved:
    def __init__(self, owner: SavedTensorBytes, key: int, tensor):
        self.owner, self.key, self.tensor = owner, key, tensor

    def __del__(self):
        self.owner.release(self.key)


def memory_probe(overrides: list[str], repeats: int = 8) -> dict:
    """(In a fresh process.) Per backward order: the peak bytes autograd saves during one training
    micro-batch's forward of the default model, what is still held when the backward starts, and the
    fastest forward+backward of ``repeats``, the orders alternating on the same model."""
    import time

    import torch

    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.platform import setup
    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy, init_distributed

    cfg = load_config(str(CONFIG), ["model.vocab_size=4096", *overrides])
    plat = setup("cpu")
    init_distributed(cfg, plat)
    comp = build_components(cfg, plat, padded_vocab_size(4096, cfg), with_optimizer=False)
    gpt = unwrap(comp.model[0])
    b, s = cfg.training.micro_batch_size, cfg.training.seq_length
    tokens = torch.randint(0, 4096, (b, s), generator=torch.Generator().manual_seed(0))
    labels, mask, pos = torch.roll(tokens, -1, 1), torch.ones(b, s), torch.arange(s).expand(b, s)

    def step(head_by_head: bool, tracker=None) -> float:
        gpt.head_by_head_backward = head_by_head
        start = time.perf_counter()
        hooks = torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack) if tracker else nullcontext()
        with hooks:
            out = gpt(tokens, pos, None, labels=labels, loss_mask=mask)
            held = tracker.current if tracker else 0
        ((out * mask).sum() / mask.sum()).backward()
        if tracker:
            tracker.held = held
        return time.perf_counter() - start

    result = {}
    orders = {"all heads at once": False, "head by head": True}
    for name, head_by_head in orders.items():
        tracker = SavedTensorBytes(gpt.parameters())
        step(head_by_head, tracker)
        result[name] = {"peak_forward_bytes": tracker.peak, "held_for_backward_bytes": tracker.held, "times": []}
    for _ in range(repeats):
        for name, head_by_head in orders.items():
            result[name]["times"].append(step(head_by_head))
    destroy()
    for r in result.values():
        r["fwd_bwd_s"] = min(r.pop("times"))
    return result


def measure_memory(names: list[str], threads: int) -> dict[str, dict]:
    rows = {}
    for name in names:
        proc = subprocess.run([sys.executable, __file__, "--memory-probe", json.dumps(VARIANTS[name][1])], cwd=ROOT,
                              env=_env(threads), capture_output=True, text=True)
        if proc.returncode != 0:
            raise SystemExit(f"memory probe {name} failed:\n{proc.stderr[-4000:]}")
        rows[name] = json.loads(proc.stdout.strip().splitlines()[-1])
    return rows


def timing_rounds(out: Path, names: list[str], rounds: int, steps: int, threads: int) -> dict[str, dict]:
    """Step time per variant: the fastest of interleaved short runs (one fresh run per variant per round;
    on a shared machine other load only ever adds time)."""
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names:
            run = out / "timing" / f"{name}-{r}"
            train(run, VARIANTS[name][1], steps, threads, reuse=False)
            times[name].append(step_time(run)[0])
            shutil.rmtree(run, ignore_errors=True)
    return {name: {"step_time_s": min(t), "rounds_s": t} for name, t in times.items()}


# -- report ------------------------------------------------------------------------------------------


def _fmt(values, digits=3) -> str:
    return " / ".join(f"{v:.{digits}f}" for v in values) if values else "–"


def table(results: dict) -> str:
    lines = ["| variant | valid LM loss | valid MTP loss per depth | teacher-forced acceptance per depth | "
             "accept length K=1 / 2 / 3 | acceptance per position at K=3 (parallel: K=n) | step time (s) |",
             "|---|---|---|---|---|---|---|"]
    for r in results.values():
        spec = r.get("speculative", {})
        lengths = " / ".join(f"{spec[k]['accept_length']:.3f}" if k in spec else "–" for k in (1, 2, 3))
        last = spec[max(spec)]["acceptance_per_position"] if spec else []
        lines.append(f"| {r['title']} | {r['eval']['lm_loss']:.4f} | {_fmt(r['eval']['mtp_loss'])} | "
                     f"{_fmt(r['eval']['mtp_acceptance'])} | {lengths if spec else '–'} | {_fmt(last)} | "
                     f"{r['step_time_s']:.3f} |")
    return "\n".join(lines)


def memory_table(rows: dict[str, dict]) -> str:
    lines = ["| variant | backward order | peak saved-tensor MiB in one micro-batch's forward | held for backward MiB "
             "| forward+backward of one micro-batch (s) |", "|---|---|---|---|---|"]
    for name, orders in rows.items():
        for order, r in orders.items():
            peak, held = r["peak_forward_bytes"] / 2**20, r["held_for_backward_bytes"] / 2**20
            lines.append(f"| {VARIANTS[name][0]} | {order} | {peak:.1f} | {held:.1f} | {r['fwd_bwd_s']:.3f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=300, help="optimizer steps per variant (default 300, as the "
                        "default config)")
    parser.add_argument("--out", default=str(ROOT / "runs" / "compare_mtp_styles"))
    parser.add_argument("--variants", default="d0,seq2,par2,par3", help=f"comma-separated of {', '.join(VARIANTS)}")
    parser.add_argument("--eval-steps", type=int, default=16, help="validation global batches (default 16)")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens per prompt when decoding (default 64)")
    parser.add_argument("--threads", type=int, default=1, help="OMP threads of each process (default 1)")
    parser.add_argument("--reuse", action="store_true", help="keep runs that already finished")
    parser.add_argument("--no-memory", action="store_true", help="skip the measurement of Gloeckle's order")
    parser.add_argument("--timing-rounds", type=int, default=3, help="interleaved timing rounds (default 3)")
    parser.add_argument("--timing-steps", type=int, default=30, help="steps of each timing run (default 30)")
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_probe is not None:
        print(json.dumps(memory_probe(json.loads(args.memory_probe))))
        return 0
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    names = args.variants.split(",")
    results = {}
    for name in names:
        title, overrides = VARIANTS[name]
        run = out / name
        wall = train(run, overrides, args.steps, args.threads, args.reuse)
        median_step, last = step_time(run)
        depth = int(next((o.split("=")[1] for o in overrides if o.startswith("mtp.num_layers=")), "0"))
        style = "parallel" if "mtp.style=parallel" in overrides else "sequential"
        r = {"title": title, "train_wall_s": wall, "train_step_time_s": median_step,
             "train_lm_loss": last["train/lm_loss"], "tokens": int(last["progress/consumed_tokens"]),
             "eval": evaluate(run, args.eval_steps, args.threads)}
        if depth:
            r["speculative"] = speculative(run, depth, style, args.new_tokens)
        results[name] = r
        print(f"{title}: {r['tokens']} tokens, valid lm_loss {r['eval']['lm_loss']:.4f}", flush=True)
    timing = timing_rounds(out, names, args.timing_rounds, args.timing_steps, args.threads)
    for name, r in results.items():
        r["step_time_s"] = timing[name]["step_time_s"]
    report = {"steps": args.steps, "variants": results, "timing": timing}
    print()
    print(table(results))
    parallel = [n for n in names if "mtp.style=parallel" in VARIANTS[n][1]]
    if parallel and not args.no_memory:
        report["memory"] = measure_memory(parallel, args.threads)
        print()
        print(memory_table(report["memory"]))
    (out / "results.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
