"""The chunked output-layer loss (kernels.chunked_output_loss) against the whole logits: peak memory and
time of the output layer's forward + backward, and of a whole forward + backward of the model.

For each MTP depth D and target kind, one process builds the model (MTPObjectiveGPTModel, the benchmark
size) and runs both variants, switching the model's ``output_chunk`` between the chunk and None:
- output layer: the model's own loss code (``output_losses``) from hidden states of the main model and
  the D depths that require grad, through its backward (the output weight's gradient included);
- step: the model's forward with labels (main loss and MTP terms) and its backward.
Peak memory is the process's resident high-water mark over the region (Linux VmHWM, reset before it
through /proc/self/clear_refs) minus the resident bytes at its start; the child runs with a fixed malloc
mmap threshold, so every tensor above 64 KiB is returned to the system when freed. Times are medians of
alternating rounds (_train_bench.interleaved). The predicted step ratio at DeepSeek-V3 671B puts the
chunked path's extra output-layer FLOPs (the logits recomputed in backward; for self, the teacher's
logits computed twice per depth) over its training FLOPs per token.

    .venv/bin/python tools/bench/bench_chunked_loss.py [--seq 8192 --vocab 32768 --depths 1,3 ...]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[2]


def _status_bytes(key: str) -> int:
    return int(re.search(rf"{key}:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) * 1024


def peak_of(fn) -> int:
    """Resident bytes above the start that ``fn`` reached (module note)."""
    import gc

    gc.collect()
    Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
    start = _status_bytes("VmRSS")
    fn()
    return _status_bytes("VmHWM") - start


def child(args) -> dict:
    import torch
    from _train_bench import after_unscheduled_backward, bench_config, interleaved, single_process_setup

    from megatron_mtp.training.components import build_components, unwrap
    from megatron_mtp.training.distributed import destroy

    args.micro_batch = 1
    _, plat, vocab = single_process_setup(args)
    cfg = bench_config(args, (f"mtp.num_layers={args.depth}", f"mtp.targets={args.target}",
                              "kernels.chunked_output_loss=true", f"kernels.output_loss_chunk={args.chunk}"))
    torch.manual_seed(0)
    comp = build_components(cfg, plat, vocab, with_optimizer=False)
    model = comp.model[0]
    gpt = unwrap(model)
    comp.config.mtp_loss_scaling_factor = 0.3
    s, h, d = args.seq, args.hidden, args.depth
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, args.vocab, (1, s), generator=gen)
    labels, mask, pos = torch.roll(tokens, -1, 1), torch.ones(1, s), torch.arange(s).unsqueeze(0)
    hidden = [torch.randn(s, 1, h, generator=gen).requires_grad_() for _ in range(1 + d)]
    weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None

    def output_layer():
        lm, terms = gpt.output_losses(hidden[0], hidden[1:], labels, mask, output_weight=weight)
        ((lm * mask).sum() / mask.sum() + sum(t.sum() for t in terms)).backward()
        for x in hidden:
            x.grad = None

    def step():
        out = model(tokens, pos, None, labels=labels, loss_mask=mask)
        ((out * mask).sum() / mask.sum()).backward()
        model.zero_grad_buffer()
        after_unscheduled_backward()

    def variant(chunk, fn):
        def run():
            gpt.output_chunk = chunk
            fn()
        return run

    runs = {f"{what} {name}": variant(chunk, fn) for name, chunk in (("whole", None), ("chunked", args.chunk))
            for what, fn in (("output", output_layer), ("step", step))}
    for run in runs.values():  # warm: the gradient buffers and one-time allocations exist before measuring
        run()
    peaks = {name: peak_of(run) for name, run in runs.items()}
    times = interleaved(runs, rounds=args.rounds, steps_per_round=1, warmup=0)
    destroy()
    return {"peaks": peaks, "times": times, "vocab": vocab, "threads": torch.get_num_threads()}


def predicted_step_ratio(depth: int, target: str) -> float:
    """1 + the chunked path's extra output-layer FLOPs over the training FLOPs per token, DeepSeek-V3 671B."""
    from megatron_mtp.config import load_config
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.models.deepseek_v3.sizes import training_flops_per_token

    cfg = load_config(str(ROOT / "configs" / "deepseek_v3_671b.yaml"), [f"mtp.num_layers={depth}"])
    vocab = padded_vocab_size(cfg.model.vocab_size, cfg)
    call = 2 * cfg.model.hidden_size * vocab  # one token's logits, one matmul
    extra = (1 + depth) * call  # every call recomputes its logits in backward
    if target != "tokens":
        extra += depth * 2 * call  # a soft depth computes its teacher's logits in forward and in backward
    return 1 + extra / training_flops_per_token(cfg, vocab, depth)


def main() -> None:
    from _train_bench import model_arguments

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    model_arguments(ap)
    ap.set_defaults(seq=8192, vocab=32768, hidden=128, rounds=3)
    ap.add_argument("--chunk", type=int, default=2048)
    ap.add_argument("--depths", default="1,3")
    ap.add_argument("--targets", default="tokens,self")
    ap.add_argument("--depth", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--target", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.depth is not None:
        print(json.dumps(child(args)))
        return
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    rows = []
    for depth in (int(x) for x in args.depths.split(",")):
        for target in args.targets.split(","):
            cmd = [sys.executable, __file__, *sys.argv[1:], f"--depth={depth}", f"--target={target}"]
            print(f"D={depth} {target}: measuring ...", file=sys.stderr, flush=True)
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
            if proc.returncode:
                sys.exit(f"bench_chunked_loss: the D={depth} {target} run failed:\n{proc.stderr[-3000:]}")
            rows.append((depth, target, json.loads(proc.stdout.strip().splitlines()[-1])))
    first = rows[0][2]
    print(f"model: hidden {args.hidden}, layers {args.layers}, seq {args.seq}, vocab {first['vocab']}, micro batch 1, "
          f"chunk {args.chunk}, threads {first['threads']}; peak MiB above the start of the region, ms medians")
    print(f"{'D':>2s} {'targets':8s} | {'output peak whole':>17s} {'chunked':>8s} {'ratio':>6s} | {'time ratio':>10s}"
          f" | {'step peak whole':>15s} {'chunked':>8s} {'ratio':>6s} | {'step ms whole':>13s} {'chunked':>8s}"
          f" {'ratio':>6s} | {'671B predicted':>14s}")
    mib = 2 ** 20
    for depth, target, r in rows:
        p, t = r["peaks"], r["times"]
        print(f"{depth:2d} {target:8s} | {p['output whole'] / mib:17.0f} {p['output chunked'] / mib:8.0f} "
              f"{p['output whole'] / p['output chunked']:6.2f} | "
              f"{t['output chunked'] / t['output whole']:10.3f} | {p['step whole'] / mib:15.0f} "
              f"{p['step chunked'] / mib:8.0f} {p['step whole'] / p['step chunked']:6.2f} | "
              f"{t['step whole'] * 1e3:13.0f} {t['step chunked'] * 1e3:8.0f} {t['step chunked'] / t['step whole']:6.3f}"
              f" | {predicted_step_ratio(depth, target):14.4f}")


if __name__ == "__main__":
    main()
