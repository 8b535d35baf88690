"""Shared pieces of the training benchmarks: one process, synthetic tokens, interleaved timing.

Timings alternate between the compared variants in short blocks and report medians, so machine
noise (other processes, frequency changes) hits both sides alike.
"""

from __future__ import annotations

import atexit
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Callable

import torch


class RandomTokens:
    """GPTDataset-shaped items of random tokens (content does not change the cost)."""

    def __init__(self, vocab: int, seq: int, n: int = 4096, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.data = torch.randint(0, vocab, (256, seq + 1), generator=g)
        self.n, self.seq = n, seq

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        x = self.data[i % 256]
        return {"tokens": x[:-1], "labels": x[1:], "loss_mask": torch.ones(self.seq),
                "position_ids": torch.arange(self.seq)}


def interleaved(variants: dict[str, Callable[[], None]], rounds: int, steps_per_round: int,
                warmup: int = 2) -> dict[str, float]:
    """Median seconds per call of each variant, measured in alternating blocks."""
    for fn in variants.values():
        for _ in range(warmup):
            fn()
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(rounds):
        order = list(variants.items())
        if r % 2:
            order.reverse()
        for name, fn in order:
            start = time.perf_counter()
            for _ in range(steps_per_round):
                fn()
            times[name].append((time.perf_counter() - start) / steps_per_round)
    return {k: statistics.median(v) for k, v in times.items()}


def bare_step(components, data, num_micro: int, seq: int, mbs: int) -> None:
    """A bare megatron-core training step: schedule forward/backward, optimizer and LR step."""
    from functools import partial

    from megatron.core.pipeline_parallel import get_forward_backward_func

    def loss_func(mask, out):
        loss = (out.float() * mask).sum() / mask.sum()
        return loss, {"lm loss": loss.detach()}

    def forward_step(it, model):
        b = next(it)
        out = model(b["tokens"], b["position_ids"], None, labels=b["labels"], loss_mask=b["loss_mask"])
        return out, partial(loss_func, b["loss_mask"])

    for chunk in components.model:
        chunk.zero_grad_buffer()
    components.optimizer.zero_grad()
    get_forward_backward_func()(forward_step_func=forward_step, data_iterator=data, model=components.model,
                                num_microbatches=num_micro, seq_length=seq, micro_batch_size=mbs, forward_only=False)
    components.optimizer.step()
    components.scheduler.step(increment=1)


def model_arguments(parser) -> None:
    """Model/size options shared by the training benchmarks."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    parser.add_argument("--config", default=str(root / "configs" / "tiny_cpu.yaml"))
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--vocab", type=int, default=4096)
    parser.add_argument("--micro-batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps-per-round", type=int, default=2)


def bench_config(args, overrides: tuple[str, ...] = ()):
    """The config under test: the given YAML resized by the command-line options, one micro-batch per step,
    then ``overrides`` (dotted, as on the command line)."""
    from megatron_mtp.config import load_config

    h = args.hidden
    return load_config(args.config, [
        f"model.hidden_size={h}", f"model.num_layers={args.layers}", f"model.ffn_hidden_size={3 * h}",
        f"model.moe_ffn_hidden_size={3 * h // 4}", f"model.vocab_size={args.vocab}",
        f"training.seq_length={args.seq}", f"training.micro_batch_size={args.micro_batch}",
        f"training.global_batch_size={args.micro_batch}", "logging.tensorboard=false", *overrides,
    ])


def after_unscheduled_backward() -> None:
    """Undo what a backward outside megatron-core's schedule leaves behind: the MoE aux-loss scale as a 0-d
    tensor, which the schedule's later copy_ of its 1-element scale cannot broadcast into."""
    from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler

    MoEAuxLossAutoScaler.main_loss_backward_scale = None


def single_process_setup(args):
    """(config, platform, padded vocab) of the benchmark model in a one-process job."""
    from megatron_mtp.config.vocab import padded_vocab_size
    from megatron_mtp.platform import setup
    from megatron_mtp.training.distributed import init_distributed

    cfg = bench_config(args)
    platform = setup(cfg.training.device)
    init_distributed(cfg, platform)
    return cfg, platform, padded_vocab_size(args.vocab, cfg)


def single_process_trainer(cfg, components, run_dir):
    """A Trainer over already-built components in a one-process job (no data, no checkpoint)."""
    from types import SimpleNamespace

    from megatron_mtp.platform import current
    from megatron_mtp.training.components import TrainState
    from megatron_mtp.training.distributed import Ranks
    from megatron_mtp.training.trainer import Trainer

    session = SimpleNamespace(cfg=cfg, ranks=Ranks(0, 1, 1, 1, 1, 1, 0, 0, 0, 0), components=components,
                              state=TrainState(), platform=current())
    return Trainer(session, run_dir)


def scratch_dir(prefix: str) -> Path:
    """A temporary directory for the benchmark's run directories, removed when the process exits."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


def trainer_step(cfg, platform, vocab: int, data_set, run_dir: Path):
    """(trainer, step): the Trainer built for `cfg` and a call that runs one real training step of it
    (Trainer.train_step under megatron-core's schedule) on the next micro-batches of `data_set`."""
    from megatron.core.pipeline_parallel import get_forward_backward_func
    from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

    from megatron_mtp.training.batches import MicroBatchIterator
    from megatron_mtp.training.components import TrainState, build_components

    trainer = single_process_trainer(cfg, build_components(cfg, platform, vocab), run_dir)
    data = MicroBatchIterator(data_set, 0, cfg.training.micro_batch_size, 0, 1, device=platform.device)
    fwd_bwd, forward_step, state = get_forward_backward_func(), trainer.forward_step(), TrainState()

    def step() -> None:
        # megatron-core's aux-loss tracker is process-global and sized by the model that fills it
        get_moe_layer_wise_logging_tracker().clear()
        trainer.train_step(fwd_bwd, forward_step, data, state)

    return trainer, step
