"""Trainer overhead: our training step over a bare megatron-core forward_backward + optimizer loop,
on the same model and data in one process. Target: ratio <= 1.05.

    .venv/bin/python tools/bench/bench_trainer_overhead.py [--hidden 256 --seq 256 ...]

"Ours" is Trainer.train_step plus the per-step stop-signal agreement (an all-reduce) — everything
the loop does every step; logging/eval/checkpoint intervals are excluded on both sides. The bare
loop is what a user would write with megatron-core alone (schedule, optimizer step, LR step).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
ROOT = Path(__file__).resolve().parents[2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=str(ROOT / "configs" / "tiny_cpu.yaml"))
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--micro-batch", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--steps-per-round", type=int, default=3)
    args = ap.parse_args()

    import torch

    from _train_bench import RandomTokens, bare_step, interleaved
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron_mtp.config import load_config
    from megatron_mtp.models.deepseek_v3.model import padded_vocab_size
    from megatron_mtp.platform import setup
    from megatron_mtp.training.batches import MicroBatchIterator
    from megatron_mtp.training.distributed import Layout, destroy, init_distributed
    from megatron_mtp.training.setup import TrainState, build_components
    from megatron_mtp.training.step import make_forward_step
    from megatron_mtp.training.trainer import Trainer, _any_rank

    h = args.hidden
    cfg = load_config(args.config, [
        f"model.hidden_size={h}", f"model.num_layers={args.layers}", f"model.ffn_hidden_size={3 * h}",
        f"model.moe_ffn_hidden_size={3 * h // 4}", f"model.vocab_size={args.vocab}",
        f"training.seq_length={args.seq}", f"training.micro_batch_size={args.micro_batch}",
        f"training.global_batch_size={args.micro_batch}", "logging.tensorboard=false",
    ])
    plat = setup(cfg.training.device)
    init_distributed(cfg, plat)
    vocab = padded_vocab_size(args.vocab, cfg)
    comp = build_components(cfg, plat, vocab)
    session = type("S", (), {})()
    session.layout, session.components, session.state = Layout(0, 1, 1, 1, 1, 1, 0, 0, 0, 0), comp, TrainState()
    trainer = Trainer(cfg, Path(tempfile.mkdtemp(prefix="bench_trainer_")), session)
    ds = RandomTokens(vocab, args.seq)
    ours_data = MicroBatchIterator(ds, 0, args.micro_batch, 0, 1)
    bare_data = MicroBatchIterator(ds, 0, args.micro_batch, 0, 1)
    state, acc = TrainState(), trainer._new_accumulator()
    fwd_bwd, fstep = get_forward_backward_func(), make_forward_step(trainer.metrics)

    def ours():
        trainer.train_step(fwd_bwd, fstep, ours_data, state, acc)
        _any_rank(False)

    def bare():
        bare_step(comp, bare_data, 1, args.seq, args.micro_batch)

    times = interleaved({"ours": ours, "bare": bare}, rounds=args.rounds, steps_per_round=args.steps_per_round)
    print(f"model: hidden {h}, layers {args.layers}, seq {args.seq}, vocab {vocab}, micro batch {args.micro_batch}, "
          f"MTP D={cfg.mtp.num_layers}, device {plat.device}, threads {torch.get_num_threads()}")
    print(f"step time ours: {times['ours'] * 1e3:.1f} ms   bare megatron-core: {times['bare'] * 1e3:.1f} ms")
    print(f"ratio ours / bare: {times['ours'] / times['bare']:.3f} (target <= 1.05)")
    destroy()


if __name__ == "__main__":
    main()
