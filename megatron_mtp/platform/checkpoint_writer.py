"""Start megatron-core's checkpoint-writer results queue with 'fork' instead of 'spawn'.

megatron-core's torch_dist writer creates a multiprocessing Manager for its results queue on the
first save of a process, with the 'spawn' start method: a fresh interpreter that re-imports
everything (tens of seconds for 8 ranks on 2 cores). A 'fork' Manager serves the same queue at once.
megatron-core keeps the queue in a module global and reuses it for the life of the process, so
setting it before the first save is enough.
"""

from __future__ import annotations

TARGET = ("megatron.core.dist_checkpointing.strategies.filesystem_async", "_results_queue")


def apply() -> None:
    import importlib
    import multiprocessing

    module = importlib.import_module(TARGET[0])
    if getattr(module, TARGET[1], None) is None:
        setattr(module, TARGET[1], multiprocessing.get_context("fork").Manager().Queue())
