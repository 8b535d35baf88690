"""Where a step's time goes: seconds per phase, summed over a log interval and logged per step.

Phases: `data` (waiting for micro-batches: the reader's time the workers did not hide),
`forward_backward` (megatron-core's schedule, the data wait taken out), `optimizer` (the guarded
optimizer step and the learning-rate step). A checkpoint's save is logged on its own
(`perf/checkpoint_save_s`). On a GPU the phase boundaries synchronise the device, so that a phase's
queued kernels count in it and not in the next; the step synchronises there anyway (the loss
agreement and the gradient norm read device values), so the timers cost two perf_counter calls per
phase (tools/bench/bench_trainer_overhead.py measures the step with them).
"""

from __future__ import annotations

import contextlib
import time
from typing import Callable


class PhaseTimes:
    def __init__(self, synchronize: Callable[[], None]):
        self.synchronize = synchronize
        self.seconds = {"data": 0.0, "forward_backward": 0.0, "optimizer": 0.0}

    @contextlib.contextmanager
    def phase(self, name: str):
        self.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            self.synchronize()
            self.seconds[name] += time.perf_counter() - start

    def timed(self, iterator):
        """`iterator` whose next() counts as data wait (a list of chunk iterators: each of them)."""
        if isinstance(iterator, list):
            return [_Timed(it, self.seconds) for it in iterator]
        return _Timed(iterator, self.seconds)

    def values(self, steps: int) -> dict[str, float]:
        """'time/PHASE_s' per step of the interval (the schedule's time without its data wait), then a reset."""
        per = max(steps, 1)
        out = {"time/data_s": self.seconds["data"] / per,
               "time/forward_backward_s": (self.seconds["forward_backward"] - self.seconds["data"]) / per,
               "time/optimizer_s": self.seconds["optimizer"] / per}
        for name in self.seconds:
            self.seconds[name] = 0.0
        return out


class _Timed:
    def __init__(self, iterator, seconds: dict):
        self.iterator, self.seconds = iterator, seconds

    def __iter__(self):
        return self

    def __next__(self):
        start = time.perf_counter()
        try:
            return next(self.iterator)
        finally:
            self.seconds["data"] += time.perf_counter() - start
