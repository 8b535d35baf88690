"""Start megatron-core's checkpoint-writer results queue ourselves: forked, and deaf to exit signals.

megatron-core's torch_dist writer creates a multiprocessing Manager for its results queue on the
first save of a process, with the 'spawn' start method: a fresh interpreter that re-imports
everything (tens of seconds for 8 ranks on 2 cores). A 'fork' Manager serves the same queue at once.

The Manager is a child process of the trainer, so the save-and-exit signals that Slurm sends to
every process of a job step (SIGUSR1, SIGTERM) reach it too; by default they kill it, and the
save the signal asked for then fails ('Connection refused'). Ours ignores them and dies with its
parent instead (PR_SET_PDEATHSIG on Linux). megatron-core keeps the queue in a module global and
reuses it for the life of the process, so setting it once, before the first save, is enough.
"""

from __future__ import annotations

import ctypes
import signal

TARGET = ("megatron.core.dist_checkpointing.strategies.filesystem_async", "_results_queue")
_PR_SET_PDEATHSIG = 1


def _writer_manager_init() -> None:
    for sig in (signal.SIGUSR1, signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_IGN)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the Manager ends at its parent's normal exit
        pass


def apply() -> None:
    import importlib
    import multiprocessing
    from multiprocessing.managers import SyncManager

    module = importlib.import_module(TARGET[0])
    if getattr(module, TARGET[1], None) is None:
        manager = SyncManager(ctx=multiprocessing.get_context("fork"))
        manager.start(initializer=_writer_manager_init)
        module._megatron_mtp_writer_manager = manager  # keep it referenced for the life of the process
        setattr(module, TARGET[1], manager.Queue())
