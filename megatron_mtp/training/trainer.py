"""The training loop over megatron-core's pipeline schedules.

One `train()` call: set up the platform and process groups, build model/optimizer/scheduler,
resume if the run directory (or checkpoint.load) has a checkpoint, then step until max_steps or a
save-and-exit signal. Exit codes: 0 finished, 75 saved on a signal and should be resumed.
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import torch

from megatron_mtp.config import Config
from megatron_mtp.errors import UserError
from megatron_mtp.platform import all_reduce_sum
from megatron_mtp.training import checkpointing as ckpt_io
from megatron_mtp.training.batches import MicroBatchIterator
from megatron_mtp.training.hooks import attach_metrics
from megatron_mtp.training.logging_utils import RunLogger, format_step_line
from megatron_mtp.training.metrics import max_violation, memory_gib
from megatron_mtp.training.schedules import mtp_lambda
from megatron_mtp.training.setup import TrainState
from megatron_mtp.training.step import make_forward_step

EXIT_FINISHED = 0
EXIT_RESUME = 75  # EX_TEMPFAIL: saved on a signal; run the same command again to continue


class _SignalFlag:
    def __init__(self, names: list[str]):
        self.received: str | None = None
        for name in names:
            sig = getattr(signal, name, None)
            if sig is None:
                raise UserError(f"checkpoint.exit_signals has unknown signal '{name}'; use names like SIGUSR1")
            signal.signal(sig, self._handle)

    def _handle(self, signum, frame):
        self.received = signal.Signals(signum).name


def _any_rank(flag: bool) -> bool:
    t = all_reduce_sum(torch.tensor([1.0 if flag else 0.0]), op=torch.distributed.ReduceOp.MAX)
    return bool(t.item() > 0)


class Trainer:
    def __init__(self, cfg: Config, run_dir: Path, session):
        """`session` is a training.session.Session (platform, layout, data, components)."""
        self.cfg = cfg
        self.run_dir = run_dir
        self.s = session
        self.layout = session.layout
        self.comp = session.components
        self.log = RunLogger(run_dir, enabled=self.layout.rank == 0, tensorboard=cfg.logging.tensorboard)
        self.metrics, self.expert_load = attach_metrics(self.comp.model[0], cfg, self.layout)
        t = cfg.training
        self.num_micro = t.global_batch_size // (t.micro_batch_size * self.layout.dp)
        self.tokens_per_step = t.global_batch_size * t.seq_length
        self._aux: torch.Tensor | None = None  # [sum, count] per layer of the MoE balance loss

    # ------------------------------------------------------------------ loop
    def train(self) -> int:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cfg, lay = self.cfg, self.layout
        state = self.s.state
        if state.step >= cfg.training.max_steps:
            self.log.info(f"run already finished at step {state.step} (training.max_steps={cfg.training.max_steps})")
            return EXIT_FINISHED
        flag = _SignalFlag(cfg.checkpoint.exit_signals)
        fwd_bwd = get_forward_backward_func()
        forward_step = make_forward_step(self.metrics)
        data = MicroBatchIterator(self.s.train_dataset, state.consumed_samples, cfg.training.micro_batch_size,
                                  lay.dp_rank, lay.dp, device=self.s.platform.device)
        acc = self._new_accumulator()
        interval_start = time.perf_counter()
        interval_steps = 0
        while state.step < cfg.training.max_steps:
            self.train_step(fwd_bwd, forward_step, data, state, acc)
            interval_steps += 1

            stop_signal = _any_rank(flag.received is not None)
            if state.step % cfg.logging.log_interval == 0 or state.step == cfg.training.max_steps or stop_signal:
                elapsed = time.perf_counter() - interval_start
                self._log_interval(state, acc, interval_steps, elapsed)
                acc = self._new_accumulator()
                interval_start, interval_steps = time.perf_counter(), 0
            if cfg.logging.eval_interval and state.step % cfg.logging.eval_interval == 0 and self.s.valid_dataset is not None:
                self._evaluate(state)
            finished = state.step >= cfg.training.max_steps
            periodic = cfg.checkpoint.save_interval and state.step % cfg.checkpoint.save_interval == 0
            if finished or periodic or stop_signal:
                path = self.save(state)
                self.log.info(f"saved checkpoint {path}")
            if stop_signal:
                self.log.info(f"received {flag.received or 'a stop signal on another rank'}: "
                              f"saved at step {state.step}, exiting with code {EXIT_RESUME} to be resumed")
                self.log.close()
                return EXIT_RESUME
        self.log.info(f"training finished at step {state.step}")
        self.log.close()
        return EXIT_FINISHED

    def train_step(self, fwd_bwd, forward_step, data, state: TrainState, acc: torch.Tensor) -> None:
        """One optimizer step: λ for the tokens consumed so far, forward/backward over all
        micro-batches through megatron-core's schedule, optimizer and LR scheduler steps."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        cfg = self.cfg
        lam = mtp_lambda(cfg, state.consumed_tokens)
        self.comp.config.mtp_loss_scaling_factor = lam  # read by GPTModel at every forward
        if self.metrics is not None:  # acceptance is measured on the last step of each log interval
            upcoming = state.step + 1
            self.metrics.active = upcoming % cfg.logging.log_interval == 0 or upcoming == cfg.training.max_steps
        for chunk in self.comp.model:
            chunk.zero_grad_buffer()
        self.comp.optimizer.zero_grad()
        losses = fwd_bwd(
            forward_step_func=forward_step, data_iterator=data, model=self.comp.model,
            num_microbatches=self.num_micro, seq_length=cfg.training.seq_length,
            micro_batch_size=cfg.training.micro_batch_size, forward_only=False,
        )
        ok, grad_norm, _ = self.comp.optimizer.step()
        if not ok:
            raise RuntimeError(f"optimizer step {state.step + 1} was skipped (non-finite gradients)")
        self.comp.scheduler.step(increment=1)
        state.step += 1
        state.consumed_samples += cfg.training.global_batch_size
        state.consumed_tokens += self.tokens_per_step
        self._accumulate(acc, losses, MTPLossLoggingHelper, lam, grad_norm)
        self._accumulate_aux_loss()
        clear_aux_losses_tracker()  # megatron-core accumulates per-layer aux losses until cleared

    def save(self, state: TrainState) -> Path:
        return ckpt_io.save_checkpoint(self.run_dir, self.cfg, self.comp, state, self.layout,
                                       self.s.tokenizer, self.cfg.checkpoint.keep_last)

    # ------------------------------------------------------------ metrics
    def _new_accumulator(self) -> torch.Tensor:
        d = max(self.cfg.mtp.num_layers, 1)
        # [lm_loss_sum, contributions, grad_norm_sum, lambda, lr] + mtp_loss[d] + accept[d] + correct[d] + count[d]
        return torch.zeros(5 + 4 * d, dtype=torch.float64)

    def _accumulate(self, acc, losses, helper, lam, grad_norm) -> None:
        d = max(self.cfg.mtp.num_layers, 1)
        contributes = self.layout.is_last_stage and self.layout.tp_rank == 0
        if contributes and losses:
            acc[0] += sum(float(x["lm loss"]) for x in losses) / len(losses)
            acc[1] += 1
            tracker = helper.tracker
            if "values" in tracker and self.cfg.mtp.num_layers:
                acc[5:5 + d] += tracker["values"].double().cpu() / self.num_micro
        if "values" in helper.tracker:
            helper.clean_loss_in_tracker()
        if self.metrics is not None:
            if contributes:
                acc[5 + d:5 + 2 * d] += self.metrics.sums[0]
                acc[5 + 2 * d:5 + 3 * d] += self.metrics.sums[1]
                acc[5 + 3 * d:5 + 4 * d] += self.metrics.sums[3]
            self.metrics.reset()
        acc[2] += float(grad_norm or 0.0)
        acc[3] = lam
        acc[4] = self.comp.optimizer.param_groups[0]["lr"]

    def _accumulate_aux_loss(self) -> None:
        """Per-layer MoE balance loss (unscaled by its coefficient) from megatron-core's tracker."""
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        for name, entry in get_moe_layer_wise_logging_tracker().items():
            if "load_balancing" not in name:
                continue
            values = entry["values"].detach().double().cpu() / self.num_micro
            if self._aux is None or self._aux.shape[1] != values.numel():
                self._aux = torch.zeros(2, values.numel(), dtype=torch.float64)
            self._aux[0] += values
            self._aux[1] += (values != 0).double()

    def _aux_loss_mean(self) -> float:
        """Mean over MoE layers of the balance loss, averaged over the ranks and steps that saw it."""
        if self._aux is None:
            return 0.0
        totals = all_reduce_sum(self._aux.clone())
        self._aux.zero_()
        seen = totals[1] > 0
        return float((totals[0][seen] / totals[1][seen]).mean()) if bool(seen.any()) else 0.0

    def _log_interval(self, state: TrainState, acc: torch.Tensor, steps: int, elapsed: float) -> None:
        d = self.cfg.mtp.num_layers
        dd = max(d, 1)
        local = acc.clone()
        # only last-stage TP-rank-0 ranks contribute loss/metric sums; every rank has grad norm/lr
        shared = local[2:5].clone()
        local[2:5] = 0
        local = all_reduce_sum(local)
        loads = all_reduce_sum(self.expert_load.counts.clone()).cpu()
        self.expert_load.reset()
        contributions = max(float(local[1]), 1.0)
        values = {
            "train/lm_loss": float(local[0]) / contributions,
            "train/mtp_lambda": float(shared[1]),
            "train/lr": float(shared[2]),
            "train/grad_norm": float(shared[0]) / max(steps, 1),
            "perf/step_time_s": elapsed / max(steps, 1),
            "perf/tokens_per_s": self.tokens_per_step * steps / max(elapsed, 1e-9),
            "perf/memory_gib": memory_gib(),
            "moe/max_violation": max_violation(loads),
            "moe/balance_loss": self._aux_loss_mean(),
            "progress/consumed_tokens": float(state.consumed_tokens),
        }
        for k in range(1, d + 1):
            count = max(float(local[5 + 3 * dd + k - 1]), 1.0)
            values[f"train/mtp_loss_{k}"] = float(local[5 + k - 1]) / contributions
            values[f"train/mtp_acceptance_{k}"] = float(local[5 + dd + k - 1]) / count
            values[f"train/mtp_accuracy_{k}"] = float(local[5 + 2 * dd + k - 1]) / count
        self.log.info(format_step_line(state.step, self.cfg.training.max_steps, values, d))
        self.log.scalars(state.step, values)

    def _evaluate(self, state: TrainState) -> None:
        from megatron_mtp.training.evaluation import evaluate

        result = evaluate(self.s, self.cfg.logging.eval_steps, self.metrics)
        if self.layout.rank == 0:
            scalars = {"valid/lm_loss": result["lm_loss"]}
            for k, (loss, accept) in enumerate(zip(result["mtp_loss"], result["mtp_acceptance"]), start=1):
                scalars[f"valid/mtp_loss_{k}"] = loss
                scalars[f"valid/mtp_acceptance_{k}"] = accept
            self.log.scalars(state.step, scalars)
            self.log.info(f"eval at step {state.step}: lm_loss {result['lm_loss']:.4f} "
                          f"ppl {math.exp(min(result['lm_loss'], 50)):.2f} mtp_loss {result['mtp_loss']} "
                          f"mtp_acceptance {result['mtp_acceptance']}")
