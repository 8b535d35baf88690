"""Saving a run's checkpoints: synchronous or in the background, and never publishing a bad one.

Design note. A save writes every rank's shards into RUN_DIR/checkpoints/step_N.<id>.tmp/ with
megatron-core's dist_checkpointing (fully parallel: the data-parallel replicas share the writing of
replicated tensors), then *publishes*: every rank hashes the shard files it wrote, and rank 0
adds config.yaml, tokenizer/, train_state.json and, last, manifest.json (every file, its size and
its digest: a step missing or cutting off any of them is incomplete and never resumed from, see
checkpoint/run_dir.py; one whose bytes changed is set aside at the load, checkpoint/digests.py),
renames the directory to step_N, replaces `latest` through a temp file, and prunes to keep_last
(old steps renamed at once and removed in the background, so the publishing barrier never waits on
a large rmtree; the next save's free-space check counts what is left of them as it vanishes).
  - async (checkpoint.async_save): dist_checkpointing returns an AsyncRequest whose writer runs in
    a forked process while training goes on; publishing is added as its last finalize step, so it
    runs only after megatron-core gathered every rank's write results and wrote the global
    metadata. `poll()` (every step, every rank: it is collective) finalizes a finished save; a new
    save and the end of training wait for the pending one.
  - before writing: the parameters are synced (overlap_param_gather), checked finite on every
    rank (a non-finite model is never saved), and rank 0 checks that the disk holds another
    checkpoint of the size of the last one.
  - a failed write (full disk, file-size limit, read-only or vanished directory, I/O error), found when it happens
    or when the background write is finalized, removes its .tmp, leaves `latest` as it was, and
    ends the run with one sentence; the next run resumes from `latest` with nothing to clean up.
The .tmp name carries an id of this launch, so a writer left over from a killed run can never write
into a later run's save of the same step.
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

from megatron_mtp.checkpoint.digests import own_digests
from megatron_mtp.checkpoint.info import optimizer_layout, train_state_record, write_checkpoint_info
from megatron_mtp.checkpoint.run_dir import CHECKPOINTS_DIR, complete_steps, publish_step, step_dir_name, write_latest
from megatron_mtp.errors import RunError
from megatron_mtp.platform import all_reduce_sum, write_progress
from megatron_mtp.platform.megatron_core import background_save_options, write_legacy_common
from megatron_mtp.training.checkpoint_state import sharded_state_dict
from megatron_mtp.training.components import TrainState
from megatron_mtp.write_causes import describe_failure, free_bytes, others_failed, size_text


def _write_failures() -> tuple:
    # torch.distributed.checkpoint reports a failed write on every rank as a CheckpointException,
    # which derives from BaseException, not Exception
    from torch.distributed.checkpoint.api import CheckpointException

    return (Exception, CheckpointException)


_WRITE_FAILURES = _write_failures()


@dataclass
class _Save:
    step: int
    tmp: Path
    final: Path
    started: float


def _agree_all(flag: bool) -> bool:
    """True when `flag` holds on every rank."""
    return bool(all_reduce_sum(torch.tensor([0.0 if flag else 1.0]))[0] == 0)


DELETING = ".deleting"
"""Suffix of a pruned checkpoint being removed in the background."""


def _remove_all(paths: list[Path]) -> None:
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _dir_bytes(path: Path) -> int:
    """Bytes of the files under `path`, counting what is there: a file or directory removed while it is
    summed (a pruned step's background removal) counts as gone, never as an error."""
    total = 0
    for folder, _, names in os.walk(path):  # os.walk skips a directory that vanished
        for name in names:
            try:
                total += os.stat(os.path.join(folder, name), follow_symlinks=False).st_size
            except OSError:
                continue
    return total


class CheckpointSaver:
    def __init__(self, run_dir: Path, cfg, components, ranks, tokenizer, data_prefixes: Optional[dict] = None):
        self.root = run_dir / CHECKPOINTS_DIR
        self.data_prefixes = {"data_prefixes": data_prefixes} if data_prefixes else {}
        """The datasets the run reads, for train_state.json (data/record.py)."""
        self.cfg = cfg
        self.components = components
        self.ranks = ranks
        self.tokenizer = tokenizer
        self.keep_last = cfg.checkpoint.keep_last
        self.rank0 = ranks.rank == 0
        self.queue = None
        if components.features.async_save:
            from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

            self.queue = AsyncCallsQueue(persistent=False)  # forked writers; the persistent worker needs CUDA
        self.pending: Optional[_Save] = None
        self.writing: Optional[_Save] = None
        """The synchronous save being written (the watchdog measures its writer, see write_progress)."""
        self.deleters: list[threading.Thread] = []
        """Background removals of pruned checkpoints (rank 0)."""
        self.published: list[tuple[Path, float]] = []
        """(checkpoint, seconds from the start of its save) published since the caller last looked."""
        launch = all_reduce_sum(torch.tensor([float(os.getpid() if self.rank0 else 0)]))
        self.launch_id = int(launch[0])

    # ------------------------------------------------------------------ save
    def save(self, state: TrainState) -> Path:
        """Start (async) or perform (sync) the save of `state`; returns the directory it will have."""
        self.wait()
        final = self.root / step_dir_name(state.step)
        tmp = self.root / f"{final.name}.{self.launch_id}.tmp"
        self._prepare(final, tmp, state.step)
        save = _Save(state.step, tmp, final, time.perf_counter())
        record = train_state_record(**vars(state), has_optimizer=True, weights_finite=True,
                                    world_size=self.ranks.world_size, tensor=self.ranks.tp,
                                    pipeline=self.ranks.pp, expert=self.ranks.ep, data=self.ranks.dp,
                                    optimizer_format=self.cfg.checkpoint.optimizer_format,
                                    optimizer_layout=optimizer_layout(self.cfg), **self.data_prefixes)
        self.writing = save
        try:
            try:
                request = self._write(tmp, state)
            except _WRITE_FAILURES as exc:  # a write failure ends in one sentence, a bug re-raises
                self._failed(save, exc)
            if request is None:
                self._publish_or_fail(save, record)
        finally:
            self.writing = None
        if request is not None:
            request.add_finalize_fn(lambda: self._publish(save, record))
            self.queue.schedule_async_request(request)
            self.pending = save
        return final

    def write_progress(self) -> Optional[tuple[int, int, int, bool]]:
        """(step, bytes written, bytes planned, every file complete) of this rank's checkpoint writer, or
        None when no save is being written (read by the watchdog's thread: a growing write is progress)."""
        save = self.writing or self.pending
        if save is None:
            return None
        return (save.step, *write_progress.progress(save.tmp))

    def poll(self) -> None:
        """Finalize a background save that has finished (collective: every rank calls it each step)."""
        self._finalize(blocking=False)

    def wait(self) -> None:
        """Block until the pending background save is published (collective)."""
        self._finalize(blocking=True)

    def close(self) -> None:
        """Release the background writer. After a normal end every save was already waited for; after
        an error a pending write is abandoned (its .tmp is never published and is removed next time).
        Old checkpoints still being deleted are waited for."""
        for thread in self.deleters:
            thread.join()
        self.deleters.clear()
        if self.queue is not None:
            self.queue.close(abort=self.pending is not None)
            self.queue = None

    def roll_back_before(self, step: int) -> Optional[Path]:
        """Make the newest checkpoint saved before `step` the latest one (collective); the newer ones
        move to checkpoints.rolled-back/ (kept for inspection, never resumed from). None if there is none."""
        self.wait()
        target = None
        if self.rank0:
            steps = [p for p in complete_steps(self.root) if int(p.name.split("_")[1]) < step]
            if steps:
                target = steps[-1]
                aside = self.root.parent / f"{CHECKPOINTS_DIR}.rolled-back"
                for newer in complete_steps(self.root):
                    if newer > target:
                        aside.mkdir(exist_ok=True)
                        shutil.rmtree(aside / newer.name, ignore_errors=True)
                        newer.rename(aside / newer.name)
                write_latest(self.root, target.name)
        mine = float(int(target.name.split("_")[1])) if target else -1.0
        chosen = int(all_reduce_sum(torch.tensor([mine if self.rank0 else 0.0]))[0])  # rank 0's answer
        return None if chosen < 0 else self.root / step_dir_name(chosen)

    # -------------------------------------------------------------- helpers
    def _prepare(self, final: Path, tmp: Path, step: int) -> None:
        problem = None
        if self.rank0:
            try:
                problem = self._check_room(step)
            except OSError as exc:  # rank 0 alone would raise here, and the others wait at the agreement
                problem = f"checking the free space for checkpoint {final.name} in {self.root} failed ({exc})"
            if problem is None:
                try:
                    self.root.mkdir(parents=True, exist_ok=True)
                    for stale in self.root.glob("*.tmp"):
                        shutil.rmtree(stale, ignore_errors=True)
                    tmp.mkdir()
                except OSError as exc:
                    cause = describe_failure(exc, self.root, None) or f"{type(exc).__name__}: {exc}"
                    problem = f"saving checkpoint {final.name} in {self.root} failed: {cause}"
        if not _agree_all(problem is None):
            raise RunError((problem or "saving a checkpoint failed on rank 0") + self._resume_hint())
        self.components.sync_params()
        if not _agree_all(self._weights_finite()):
            raise RunError(f"the weights at step {step} are not finite, so no checkpoint was saved"
                           + self._resume_hint())

    def _check_room(self, step: int) -> Optional[str]:
        """A reason not to start the save (rank 0): the disk cannot hold another checkpoint like the last."""
        previous = complete_steps(self.root)
        free = free_bytes(self.root)
        if not previous or free is None:
            return None
        needed = _dir_bytes(previous[-1])
        free += sum(_dir_bytes(p) for p in self.root.glob("*" + DELETING))  # being removed in the background
        if free >= needed:
            return None
        return (f"not enough free space to save checkpoint {step_dir_name(step)} in {self.root}: it needs about "
                f"{size_text(needed)} (the size of {previous[-1].name}) and {size_text(free)} are free; free space "
                "or lower checkpoint.keep_last")

    def _weights_finite(self) -> bool:
        checks = [torch.isfinite(p).all() for chunk in self.components.model for p in chunk.parameters()]
        return bool(torch.stack(checks).all()) if checks else True  # one device sync, not one per tensor

    def _write(self, tmp: Path, state: TrainState):
        from megatron.core import dist_checkpointing, parallel_state
        from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
        from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

        strategy = get_default_save_sharded_strategy("torch_dist")
        if self.cfg.checkpoint.fully_parallel_save:
            strategy = FullyParallelSaveStrategyWrapper(
                strategy, parallel_state.get_data_parallel_group(with_context_parallel=True))
        sd = sharded_state_dict(self.components, state, with_optimizer=True, is_loading=False,
                                optimizer_format=self.cfg.checkpoint.optimizer_format)
        background = self.queue is not None
        return dist_checkpointing.save(sd, str(tmp), sharded_strategy=strategy, async_sharded_save=background,
                                       **(background_save_options() if background else {}))

    def _publish(self, save: _Save, record: dict) -> None:
        # every rank hashes the shard files it wrote, rank 0 writes them into the manifest (checkpoint/digests.py)
        digests = [None] * self.ranks.world_size if self.rank0 else None
        torch.distributed.gather_object(own_digests(save.tmp, self.ranks.rank), digests, dst=0)
        if self.rank0:
            write_legacy_common(save.tmp)  # megatron-core 0.19 writes none; 0.16 needs it
            gathered = {name: digest for found in digests for name, digest in (found or {}).items()}
            write_checkpoint_info(save.tmp, self.cfg, record, self.tokenizer, digests=gathered)
            publish_step(save.tmp, save.final)  # the name first, then latest
            self._prune(keep=save.final.name)
        torch.distributed.barrier()
        write_progress.forget(save.tmp)
        self.published.append((save.final, time.perf_counter() - save.started))

    def _publish_or_fail(self, save: _Save, record: dict) -> None:
        try:
            self._publish(save, record)
        except OSError as exc:
            self._failed(save, exc)

    def _finalize(self, blocking: bool) -> None:
        if self.queue is None or self.pending is None:
            return
        save = self.pending
        try:
            self.queue.maybe_finalize_async_calls(blocking=blocking)
        except _WRITE_FAILURES as exc:  # a failed background write, reported on every rank
            self.pending = None
            self._failed(save, exc)
        if self.queue.get_num_unfinalized_calls() == 0:
            self.pending = None

    def _failed(self, save: _Save, exc: BaseException):
        """End the run with one sentence for a failed write (re-raise anything that is not a write failure)."""
        estimate, at_least = None, False
        if self.rank0:
            previous = complete_steps(self.root)
            if previous:  # the last checkpoint of the run: about the size of this one
                estimate = _dir_bytes(previous[-1])
            elif save.tmp.exists():  # what was written before the failure
                estimate, at_least = _dir_bytes(save.tmp), True
        cause = describe_failure(exc, self.root, estimate, at_least, written=save.tmp)  # before the removal
        if cause is None and others_failed(exc):  # the coordinator (rank 0) holds and prints the cause
            cause = "the write failed on another rank"
        if self.rank0:
            shutil.rmtree(save.tmp, ignore_errors=True)
        write_progress.forget(save.tmp)
        if cause is None:
            raise exc
        raise RunError(f"saving checkpoint {save.final.name} to {self.root} failed: {cause}; its partial files were "
                       "removed" + self._resume_hint()) from exc

    def _resume_hint(self) -> str:
        steps = complete_steps(self.root)
        if steps:
            return f"; {steps[-1].name} is still the latest checkpoint, and the same command resumes from it"
        return "; no checkpoint of this run exists yet"

    def _prune(self, keep: str) -> None:
        """Keep the newest keep_last steps, off the critical path: each older step is renamed to
        step_N.deleting at once (never resumed from) and removed by a background thread, so no rank waits
        on a large rmtree at the publishing barrier; leftovers of a killed run go with the next prune."""
        if self.keep_last <= 0:
            return
        doomed = []
        for old in complete_steps(self.root)[:-self.keep_last]:
            if old.name != keep:
                aside = old.with_name(old.name + DELETING)
                try:
                    os.replace(old, aside)
                except OSError:
                    continue
                doomed.append(aside)
        doomed += [p for p in self.root.glob("*" + DELETING) if p not in doomed]
        if doomed:
            thread = threading.Thread(target=_remove_all, args=(doomed,), name="megatron-mtp-prune", daemon=True)
            thread.start()
            self.deleters.append(thread)
