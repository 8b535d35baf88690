"""The training loop over megatron-core's pipeline schedules.

`Trainer(session).train()` steps from the session's resumed state until training.max_steps or a
save-and-exit signal, logging, evaluating and saving at their intervals. Exit codes:
EXIT_FINISHED when done, EXIT_RESUME after saving on a signal (run the same command again). A run
that must stop (non-finite step, loss spike, failed save) raises RunError: one sentence, every rank.
"""

from __future__ import annotations

import gc
import math
import os
import signal
import time
from pathlib import Path

from megatron_mtp.checkpoint.info import optimizer_layout
from megatron_mtp.config.wandb_env import wandb_options
from megatron_mtp.errors import EXIT_FINISHED, EXIT_RESUME, RunError
from megatron_mtp.models.throughput import gpu_of_device, model_flops_per_token, peak_tflops
from megatron_mtp.training import checkpoint_state
from megatron_mtp.training.batch_ramp import BatchRamp
from megatron_mtp.training.batches import MicroBatchIterator, chunk_iterators, stage_keys
from megatron_mtp.training.checkpoint_saver import CheckpointSaver
from megatron_mtp.training.components import TrainState
from megatron_mtp.training.forward_step import make_forward_step, micro_batch_mean
from megatron_mtp.training.interval import IntervalStats
from megatron_mtp.training.metric_hooks import attach_metrics
from megatron_mtp.training.phase_times import PhaseTimes
from megatron_mtp.training.run_logger import RunLogger, format_step_line
from megatron_mtp.training.schedules import mtp_lambda
from megatron_mtp.training.signals import SignalFlag
from megatron_mtp.training.step_guard import (
    LossSpikeDetector,
    StepOutcome,
    agree,
    guarded_optimizer_step,
    injected_steps,
    losses_finite,
)
from megatron_mtp.training.watchdog import Watchdog, is_collective_failure


def _device_peak_tflops(cfg, platform) -> float:
    """The GPU's peak TFLOP/s for the run's precision when the `plan` table knows it (0 on CPU)."""
    if platform.is_cpu:
        return 0.0
    import torch

    gpu = gpu_of_device(torch.cuda.get_device_name())
    return peak_tflops(gpu, cfg) if gpu is not None else 0.0


class Trainer:
    def __init__(self, session, run_dir: Path):
        """`session` is a training.session.Session (config, platform, ranks, data, components)."""
        self.session = session
        self.cfg = session.cfg
        self.run_dir = run_dir
        self.ranks = session.ranks
        self.components = session.components
        cfg = self.cfg
        wandb = None
        options = wandb_options(cfg.logging, run_dir)
        if self.ranks.rank == 0 and options is not None and session.state.step < cfg.training.max_steps:
            from megatron_mtp.training.wandb_log import WandbRun

            wandb = WandbRun(cfg, run_dir, options)
        self.log = RunLogger(run_dir, enabled=self.ranks.rank == 0, tensorboard=cfg.logging.tensorboard,
                             start_step=session.state.step, wandb=wandb)
        self.metrics, expert_load = attach_metrics(self.components.model, cfg, self.ranks)
        from megatron_mtp.platform.megatron_core import mtp_indexer_loss

        self.mtp_indexer = mtp_indexer_loss(self.components.model, cfg.mtp.num_layers)  # apart from layer 1's
        t = cfg.training
        self.ramp = BatchRamp(cfg, self.ranks.dp)  # training.rampup_batch_size
        self.times = PhaseTimes(session.platform.synchronize)
        self._frozen_steps: dict = {}
        """micro-batches per step -> the frozen-base forward_step for it (a ramp-up changes the count)."""
        self.num_micro = self.ramp.micro_batches(session.state.consumed_samples)
        self.interval = IntervalStats(cfg.mtp.num_layers, cfg.model.num_layers + cfg.mtp.num_layers, self.ranks,
                                      self.num_micro, expert_load,
                                      flops_per_token=model_flops_per_token(cfg, self.components.vocab_size),
                                      peak_tflops=_device_peak_tflops(cfg, session.platform),
                                      clip_grad=cfg.optimizer.clip_grad,
                                      with_dropped=cfg.model.moe_capacity_factor is not None)
        spike = t.loss_spike
        self.spike = LossSpikeDetector(spike.factor, spike.window, spike.patience) if spike.factor else None
        self.skipped_in_a_row = 0
        self.rollbacks = 0
        self.saver: CheckpointSaver | None = None
        self.watchdog: Watchdog | None = None
        self.last_save = time.monotonic()
        """When the last save started (checkpoint.save_interval_minutes counts from it)."""
        self.save_due = False
        self.inject_nonfinite = injected_steps("NONFINITE")
        self.inject_spike = injected_steps("SPIKE")
        self.inject_signal = injected_steps("SIGNAL")
        self.inject_eval_signal = injected_steps("EVAL_SIGNAL")

    # ------------------------------------------------------------------ loop
    def train(self) -> int:
        from megatron.core.pipeline_parallel import get_forward_backward_func

        cfg, state = self.cfg, self.session.state
        if state.step >= cfg.training.max_steps:
            self.log.info(f"run already finished at step {state.step} (training.max_steps={cfg.training.max_steps})")
            return EXIT_FINISHED
        fwd_bwd = get_forward_backward_func()
        forward_step = self.forward_step()
        self.saver = CheckpointSaver(self.run_dir, cfg, self.components, self.ranks, self.session.tokenizer,
                                     data_prefixes=self.session.data_prefixes)
        data = self._data(state)
        gc_interval = cfg.training.manual_gc_interval
        if gc_interval:
            gc.disable()
            gc.collect()
        interval_start = time.perf_counter()
        flag = SignalFlag(cfg.checkpoint.exit_signals, self.log.info)
        watchdog = self.watchdog = Watchdog(self.run_dir, self.ranks.rank, self.ranks.world_size,
                                            cfg.training.hang_timeout, self.saver.launch_id, self.saver.write_progress,
                                            state.step)
        try:
            watchdog.agree_writable()
            while state.step < cfg.training.max_steps:
                watchdog.now_doing(f"step {state.step + 1}")
                outcome, stop_signal = self.train_step(fwd_bwd, forward_step, data, state,
                                                       lambda: flag.received is not None)
                watchdog.progress(state.step, f"the work after step {state.step}")
                if outcome.reason == "rolled back":  # the step is undone: nothing to log, evaluate or save
                    data = self._data(state)
                    interval_start = time.perf_counter()
                    continue
                self.saver.poll()
                self._log_published()
                if state.step % cfg.logging.log_interval == 0 or state.step == cfg.training.max_steps or stop_signal:
                    self._log_interval(state, time.perf_counter() - interval_start)
                    interval_start = time.perf_counter()
                if (cfg.logging.eval_interval and state.step % cfg.logging.eval_interval == 0
                        and self.session.valid_dataset is not None and not stop_signal):
                    stop_signal = self._evaluate(state, lambda: flag.received is not None) or stop_signal
                finished = state.step >= cfg.training.max_steps
                periodic = cfg.checkpoint.save_interval and state.step % cfg.checkpoint.save_interval == 0
                if finished or periodic or stop_signal or self.save_due:
                    watchdog.now_doing(f"saving step {state.step}")
                    self.saver.save(state)
                    self.last_save = time.monotonic()
                    watchdog.progress(state.step, f"the work after saving step {state.step}")
                if gc_interval and state.step % gc_interval == 0:
                    gc.collect()
                if stop_signal:
                    watchdog.now_doing(f"saving step {state.step}")  # its writer's progress is watched
                    self.saver.wait()
                    self._log_published()
                    self.log.info(f"received {flag.received or 'a stop signal on another rank'}: "
                                  f"saved at step {state.step}, exiting with code {EXIT_RESUME} to be resumed")
                    return EXIT_RESUME
            watchdog.now_doing(f"saving step {state.step}")
            self.saver.wait()
            self._log_published()
            self.log.info(f"training finished at step {state.step}")
            return EXIT_FINISHED
        except RunError as exc:
            self.log.info(f"stopping: {exc}")
            raise
        except Exception as exc:
            if is_collective_failure(exc):  # a peer is gone: name it and end (never returns)
                self.log.close()
                watchdog.peer_lost(exc)
            raise
        finally:
            watchdog.stop()
            flag.restore()
            self.saver.close()  # waits only for a save that already finished on every rank
            if gc_interval:
                gc.enable()
            self.log.close()

    def forward_step(self):
        """The forward step train_step's schedule calls (mtp.freeze_base: a forward-only schedule whose
        loss function back-propagates the MTP objective)."""
        frozen = self.cfg.mtp.freeze_base
        return make_forward_step(self.metrics, mtp_only_microbatches=self.num_micro if frozen else None)

    def _data(self, state: TrainState):
        from megatron_mtp.platform.features import resolve_features

        cfg, ranks = self.cfg, self.ranks
        keys = stage_keys(ranks.pp_rank, ranks.pp, cfg.data.reset_attention_mask)
        workers = resolve_features(cfg, self.session.platform).data_workers
        return self.times.timed(chunk_iterators(
            lambda: MicroBatchIterator(self.session.train_dataset, state.consumed_samples,
                                       cfg.training.micro_batch_size, ranks.dp_rank, ranks.dp,
                                       device=self.session.platform.device, keys=keys, num_workers=workers,
                                       prefetch=cfg.data.prefetch),
            len(self.components.model)))

    def train_step(self, fwd_bwd, forward_step, data, state: TrainState,
                   signal_here=lambda: False) -> tuple[StepOutcome, bool]:
        """One optimizer step: λ for the tokens consumed so far, forward/backward over all
        micro-batches through megatron-core's schedule, the guarded optimizer step, the LR step.
        Returns the step's outcome and whether any rank received a stop signal (`signal_here()` is asked
        at the step's agreement point, so a signal that came during the forward/backward stops this step)."""
        from megatron.core.transformer.moe.moe_utils import clear_aux_losses_tracker

        from megatron_mtp.platform import megatron_core

        cfg, components = self.cfg, self.components
        global_batch = self.ramp.global_batch(state.consumed_samples)  # grows during a ramp-up
        self.num_micro = self.interval.num_micro = global_batch // self.ramp.per_micro
        if cfg.mtp.freeze_base and self.ramp.ramp is not None:  # its backward scales by the step's micro-batches
            if self.num_micro not in self._frozen_steps:
                self._frozen_steps[self.num_micro] = self.forward_step()
            forward_step = self._frozen_steps[self.num_micro]
        lam = mtp_lambda(cfg, state.consumed_tokens)
        components.config.mtp_loss_scaling_factor = lam  # read by GPTModel at every forward
        if self.metrics is not None:  # acceptance is measured on the last step of each log interval
            upcoming = state.step + 1
            self.metrics.active = upcoming % cfg.logging.log_interval == 0 or upcoming == cfg.training.max_steps
        for chunk in components.model:
            chunk.zero_grad_buffer()
        components.optimizer.zero_grad()
        with self.times.phase("forward_backward"):
            reported = fwd_bwd(
                forward_step_func=forward_step, data_iterator=data, model=components.model,
                num_microbatches=self.num_micro, seq_length=cfg.training.seq_length,
                micro_batch_size=cfg.training.micro_batch_size, forward_only=cfg.mtp.freeze_base,
            )
        if cfg.mtp.freeze_base:  # what the schedule does after its backward passes
            components.config.finalize_model_grads_func(components.model)
        if state.step + 1 in self.inject_signal:  # a save-and-exit signal during the step (step_guard.py)
            os.kill(os.getpid(), signal.SIGUSR1)
        mtp_losses = megatron_core.mtp_loss_values()
        holds_loss = self.ranks.is_last_stage and self.ranks.tp_rank == 0 and bool(reported)
        lm_loss = sum(micro_batch_mean(r) for r in reported) / len(reported) if holds_loss else None
        nonfinite = not losses_finite(reported, mtp_losses) or state.step + 1 in self.inject_nonfinite
        minutes = cfg.checkpoint.save_interval_minutes
        save_due = bool(minutes) and self.ranks.rank == 0 and time.monotonic() - self.last_save >= minutes * 60
        agreed = agree(nonfinite, signal_here(), lm_loss, save_due)
        self.save_due = agreed.save_due
        with self.times.phase("optimizer"):
            outcome = guarded_optimizer_step(components.optimizer, agreed.loss_nonfinite)
        state.step += 1
        state.consumed_samples += global_batch
        state.consumed_tokens += global_batch * cfg.training.seq_length
        self.interval.count_tokens(global_batch * cfg.training.seq_length, global_batch)
        if outcome.stepped:
            components.scheduler.step(increment=1)
            self.skipped_in_a_row = 0
            self.interval.add_step(reported, mtp_losses, self.metrics, lam,
                                   components.optimizer.param_groups[0]["lr"], outcome.grad_norm)
            self._collect_balance_loss()
        else:
            self._skipped(state, outcome)
        if self.metrics is not None:
            self.metrics.reset()
        megatron_core.clear_mtp_tracker()
        megatron_core.clear_dsa_indexer_tracker(self.mtp_indexer)
        clear_aux_losses_tracker()  # megatron-core accumulates per-layer aux losses until cleared
        if outcome.stepped and self.spike is not None and agreed.lm_loss is not None:
            seen = agreed.lm_loss * (100.0 if state.step in self.inject_spike else 1.0)
            start = self.spike.observe(state.step, seen)
            if start is not None:
                self._on_spike(state, start, agreed.lm_loss)
                outcome = StepOutcome(False, outcome.grad_norm, "rolled back")
        return outcome, agreed.stop_signal

    def _skipped(self, state: TrainState, outcome: StepOutcome) -> None:
        self.interval.skipped += 1
        if outcome.reason == "fp16 loss-scale overflow":
            return  # megatron-core lowered the loss scale; normal in fp16 training
        self.skipped_in_a_row += 1
        t = self.cfg.training
        what = {"non-finite loss": f"the loss of step {state.step} is not finite (NaN or Inf)",
                "non-finite gradients": f"the gradient norm of step {state.step} is not finite (NaN or Inf)",
                }.get(outcome.reason, f"step {state.step} failed: {outcome.reason}")
        if t.on_nonfinite == "stop":
            raise RunError(f"{what}; the run stops and saves nothing" + self._last_checkpoint() +
                           " (lower optimizer.lr, or set training.on_nonfinite=skip to skip such steps)")
        if self.skipped_in_a_row > t.max_skipped_steps:
            raise RunError(f"{what}, {self.skipped_in_a_row} skipped steps in a row (more than training."
                           f"max_skipped_steps={t.max_skipped_steps}); the run stops" + self._last_checkpoint())
        self.log.info(f"skipped step {state.step}: {outcome.reason} (grad norm {outcome.grad_norm}); "
                      f"{self.skipped_in_a_row} in a row")

    def _last_checkpoint(self) -> str:
        """'; the last checkpoint is X', after the save in flight (if any) is complete: every rank gets
        here together (the decision to stop is agreed), so waiting for the background write is safe."""
        from megatron_mtp.checkpoint.run_dir import find_checkpoint

        self.saver.wait()
        self._log_published()
        found = find_checkpoint(self.run_dir)
        return f"; the last checkpoint is {found.path}" if found else "; there is no checkpoint yet"

    def _on_spike(self, state: TrainState, start: int, loss: float) -> None:
        spike = self.cfg.training.loss_spike
        what = (f"loss spike: the LM loss stayed above {spike.factor} × its recent median for {spike.patience} "
                f"steps (from step {start}; {loss:.4f} at step {state.step})")
        if spike.action == "stop":
            raise RunError(f"{what}; the run stops" + self._last_checkpoint())
        self.rollbacks += 1
        if self.rollbacks > spike.max_rollbacks:
            raise RunError(f"{what}, after {spike.max_rollbacks} rollbacks (training.loss_spike.max_rollbacks); "
                           "the run stops" + self._last_checkpoint())
        target = self.saver.roll_back_before(start)
        if target is None:
            raise RunError(f"{what}, and no checkpoint was saved before step {start} to roll back to; the run stops")
        position = state.consumed_samples
        loaded = checkpoint_state.load_checkpoint(target, self.components, self.ranks, load_optimizer=True,
                                               fully_parallel=self.cfg.checkpoint.fully_parallel_load,
                                               layout=optimizer_layout(self.cfg))
        skipped = position - loaded.consumed_samples
        state.step, state.consumed_tokens = loaded.step, loaded.consumed_tokens
        state.consumed_samples = position  # the data since the checkpoint is skipped, not replayed
        self.spike.reset()
        self.interval.discard()
        self.log.info(f"{what}: rolled back to {target} (step {loaded.step}) and skipped the {skipped} samples "
                      f"consumed since then (rollback {self.rollbacks} of at most {spike.max_rollbacks})")
        self.interval.extra["train/rolled_back_from_step"] = float(start)

    def _collect_balance_loss(self) -> None:
        from megatron_mtp.platform.megatron_core import dsa_indexer_loss_values, moe_layer_values

        for values in moe_layer_values("load_balancing"):
            self.interval.add_balance_loss(values)
        indexer = dsa_indexer_loss_values(self.components.config, self.mtp_indexer)
        if indexer is not None:
            self.interval.add_indexer_loss(indexer)

    # ------------------------------------------------------------ logging
    def _log_published(self) -> None:
        for path, seconds in self.saver.published:
            self.log.info(f"saved checkpoint {path} ({seconds:.1f} s)")
            self.interval.extra["perf/checkpoint_save_s"] = seconds
        self.saver.published.clear()

    def _log_interval(self, state: TrainState, elapsed: float) -> None:
        steps = self.interval.steps + self.interval.skipped
        values = {**self.interval.values(state.consumed_tokens, elapsed), **self.times.values(steps)}
        self.log.info(format_step_line(state.step, self.cfg.training.max_steps, values, self.cfg.mtp.num_layers,
                                       frozen_base=bool(self.cfg.mtp.freeze_base)))
        self.log.scalars(state.step, values)
        if self.session.lock is not None:
            self.session.lock.heartbeat()

    def _evaluate(self, state: TrainState, signalled) -> bool:
        """Evaluate at `state.step`; True when a save-and-exit signal (`signalled()` on any rank) ended it early."""
        from megatron_mtp.training.evaluation import evaluate

        collect = self.cfg.training.manual_gc_interval > 0
        if collect:
            gc.collect()
        self.watchdog.now_doing(f"evaluating at step {state.step}")
        inject = state.step in self.inject_eval_signal and self.ranks.rank == 0

        def stop() -> bool:  # asked after each eval batch (step_guard.py: the injected signal, on rank 0)
            if inject and not signalled():
                os.kill(os.getpid(), signal.SIGUSR1)
            return signalled()

        with self.components.params_in_sync():
            result = evaluate(self.session, self.cfg.logging.eval_steps, self.metrics, stop=stop)
        if collect:
            gc.collect(generation=0)
        self.watchdog.progress(state.step, f"the work after evaluating at step {state.step}")
        if "stopped_after" in result:
            self.log.info(f"eval at step {state.step} stopped after {result['stopped_after']} of "
                          f"{self.cfg.logging.eval_steps} batches: a save-and-exit signal arrived")
            return True
        if self.ranks.rank == 0:
            scalars = {"valid/lm_loss": result["lm_loss"]}
            for k, (loss, accept) in enumerate(zip(result["mtp_loss"], result["mtp_acceptance"]), start=1):
                scalars[f"valid/mtp_loss_{k}"] = loss
                scalars[f"valid/mtp_acceptance_{k}"] = accept
            self.log.scalars(state.step, scalars)
            self.log.info(f"eval at step {state.step}: lm_loss {result['lm_loss']:.4f} "
                          f"ppl {math.exp(min(result['lm_loss'], 50)):.2f} mtp_loss {result['mtp_loss']} "
                          f"mtp_acceptance {result['mtp_acceptance']}")
        return False
