"""The training loop over megatron-core's pipeline schedules.

`Trainer(session).train()` steps from the session's resumed state until training.max_steps or a
save-and-exit signal, logging, evaluating and saving at their intervals. Exit codes:
EXIT_FINISHED when done, EXIT_RESUME after saving on a signal (run the same command again).
"""

from __future__ import annotations

import math
import signal
import time
from pathlib import Path

import torch

from megatron_mtp.errors import EXIT_FINISHED, EXIT_RESUME, UserError
from megatron_mtp.platform import all_reduce_sum
from megatron_mtp.training import checkpointing
from megatron_mtp.training.batches import MicroBatchIterator
from megatron_mtp.training.forward_step import make_forward_step
from megatron_mtp.training.hooks import attach_metrics
from megatron_mtp.training.interval import IntervalStats
from megatron_mtp.training.logging_utils import RunLogger, format_step_line
from megatron_mtp.training.schedules import mtp_lambda
from megatron_mtp.training.setup import TrainState


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
    def __init__(self, session, run_dir: Path):
        """`session` is a training.session.Session (config, platform, ranks, data, components)."""
        self.session = session
        self.cfg = session.cfg
        self.run_dir = run_dir
        self.ranks = session.ranks
        self.components = session.components
        cfg = self.cfg
        self.log = RunLogger(run_dir, enabled=self.ranks.rank == 0, tensorboard=cfg.logging.tensorboard)
        self.metrics, expert_load = attach_metrics(self.components.model[0], cfg, self.ranks)
        t = cfg.training
        self.num_micro = t.global_batch_size // (t.micro_batch_size * self.ranks.dp)
        self.tokens_per_step = t.global_batch_size * t.seq_length
        self.interval = IntervalStats(cfg.mtp.num_layers, cfg.model.num_layers + cfg.mtp.num_layers, self.ranks,
                                      self.num_micro, self.tokens_per_step, expert_load)

    # ------------------------------------------------------------------ loop
    def train(self) -> int:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cfg, state = self.cfg, self.session.state
        if state.step >= cfg.training.max_steps:
            self.log.info(f"run already finished at step {state.step} (training.max_steps={cfg.training.max_steps})")
            return EXIT_FINISHED
        flag = _SignalFlag(cfg.checkpoint.exit_signals)
        fwd_bwd = get_forward_backward_func()
        forward_step = make_forward_step(self.metrics)
        data = MicroBatchIterator(self.session.train_dataset, state.consumed_samples, cfg.training.micro_batch_size,
                                  self.ranks.dp_rank, self.ranks.dp, device=self.session.platform.device)
        interval_start = time.perf_counter()
        while state.step < cfg.training.max_steps:
            self.train_step(fwd_bwd, forward_step, data, state)
            stop_signal = _any_rank(flag.received is not None)
            if state.step % cfg.logging.log_interval == 0 or state.step == cfg.training.max_steps or stop_signal:
                self._log_interval(state, time.perf_counter() - interval_start)
                interval_start = time.perf_counter()
            if (cfg.logging.eval_interval and state.step % cfg.logging.eval_interval == 0
                    and self.session.valid_dataset is not None):
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

    def train_step(self, fwd_bwd, forward_step, data, state: TrainState) -> None:
        """One optimizer step: λ for the tokens consumed so far, forward/backward over all
        micro-batches through megatron-core's schedule, optimizer and LR scheduler steps."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker
        from megatron.core.transformer.multi_token_prediction import MTPLossLoggingHelper

        cfg, components = self.cfg, self.components
        lam = mtp_lambda(cfg, state.consumed_tokens)
        components.config.mtp_loss_scaling_factor = lam  # read by GPTModel at every forward
        if self.metrics is not None:  # acceptance is measured on the last step of each log interval
            upcoming = state.step + 1
            self.metrics.active = upcoming % cfg.logging.log_interval == 0 or upcoming == cfg.training.max_steps
        for chunk in components.model:
            chunk.zero_grad_buffer()
        components.optimizer.zero_grad()
        reported = fwd_bwd(
            forward_step_func=forward_step, data_iterator=data, model=components.model,
            num_microbatches=self.num_micro, seq_length=cfg.training.seq_length,
            micro_batch_size=cfg.training.micro_batch_size, forward_only=False,
        )
        ok, grad_norm, _ = components.optimizer.step()
        if not ok:
            raise RuntimeError(f"optimizer step {state.step + 1} was skipped (non-finite gradients)")
        components.scheduler.step(increment=1)
        state.step += 1
        state.consumed_samples += cfg.training.global_batch_size
        state.consumed_tokens += self.tokens_per_step
        self.interval.add_step(reported, MTPLossLoggingHelper.tracker, self.metrics, lam,
                               components.optimizer.param_groups[0]["lr"], grad_norm)
        if "values" in MTPLossLoggingHelper.tracker:
            MTPLossLoggingHelper.clean_loss_in_tracker()
        self._collect_balance_loss()
        clear_aux_losses_tracker()  # megatron-core accumulates per-layer aux losses until cleared

    def _collect_balance_loss(self) -> None:
        from megatron.core.transformer.moe.moe_utils import get_moe_layer_wise_logging_tracker

        for name, entry in get_moe_layer_wise_logging_tracker().items():
            if "load_balancing" in name:
                self.interval.add_balance_loss(entry["values"])

    def save(self, state: TrainState) -> Path:
        return checkpointing.save_checkpoint(self.run_dir, self.cfg, self.components, state, self.ranks,
                                             self.session.tokenizer, self.cfg.checkpoint.keep_last)

    # ------------------------------------------------------------ logging
    def _log_interval(self, state: TrainState, elapsed: float) -> None:
        values = self.interval.values(state.consumed_tokens, elapsed)
        self.log.info(format_step_line(state.step, self.cfg.training.max_steps, values, self.cfg.mtp.num_layers))
        self.log.scalars(state.step, values)

    def _evaluate(self, state: TrainState) -> None:
        from megatron_mtp.training.evaluation import evaluate

        result = evaluate(self.session, self.cfg.logging.eval_steps, self.metrics)
        if self.ranks.rank == 0:
            scalars = {"valid/lm_loss": result["lm_loss"]}
            for k, (loss, accept) in enumerate(zip(result["mtp_loss"], result["mtp_acceptance"]), start=1):
                scalars[f"valid/mtp_loss_{k}"] = loss
                scalars[f"valid/mtp_acceptance_{k}"] = accept
            self.log.scalars(state.step, scalars)
            self.log.info(f"eval at step {state.step}: lm_loss {result['lm_loss']:.4f} "
                          f"ppl {math.exp(min(result['lm_loss'], 50)):.2f} mtp_loss {result['mtp_loss']} "
                          f"mtp_acceptance {result['mtp_acceptance']}")
