"""One rank of a warm worker job: runs the test suite's commands in-process, one after another.

Design note. Starting a rank costs seconds before anything is tested (importing torch and
megatron-core, the gloo rendezvous), and on 2 cores eight ranks pay it eight times over. The suite
therefore keeps one job per world size alive for the whole session (tests/workers/pool.py) and
hands it command lines as a fresh process would take them (`-m megatron_mtp train ...`,
`script.py ...`, `-c code`). Every rank runs the command with its file descriptors 1 and 2 sent to
files of its own, in the environment and directory of the request, under its own RANK and
WORLD_SIZE. The job's world process group stays up between commands; what a command builds on top
of it (megatron-core's parallel state and process groups, its trackers, the RNG tracker, signal
handlers, environment variables, the loss scales megatron-core's autograd functions keep on their
classes, torch's default dtype, grad mode, thread count and the garbage collector) is torn down after
it, so each command starts as it would in a new process. A test script that patches process-wide
objects itself (tests/dist/scripts/plan_check.py counts collectives) undoes its patches before it
returns. What must start from a fresh interpreter (signals to a launcher, the console output of the
README's main job, `--nproc-per-node`, Slurm jobs) is launched as a new process by its test instead.

The pool takes a command as done when every rank has written its result. When a rank has failed and
the others have not finished a little later (they wait for it inside a collective, and gloo's own
timeouts do not reliably end such a wait), the pool ends the job, reports that one command as failed
with every rank's traceback, and starts a new job for the next one (tests/dist/test_worker_pool.py).

Usage (from pool.py): worker.py DIR [under torchrun for more than one rank]
"""

from __future__ import annotations

import datetime
import functools
import json
import os
import runpy
import signal
import sys
import time
import traceback
import types
from pathlib import Path

# the variables that make this process a rank of its job: kept whatever the request's environment says
JOB_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK",
            "ROLE_WORLD_SIZE", "ROLE_NAME", "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RESTART_COUNT",
            "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
            "TORCHELASTIC_ERROR_FILE", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "OMP_NUM_THREADS")
_THREADS = 1  # torch's intra-op threads at start, restored after each command
# process-wide class state that megatron-core keeps between steps (the loss scales its autograd
# functions read in backward), read at start and put back after each command
CLASS_STATE = (("megatron.core.transformer.moe.moe_utils", "MoEAuxLossAutoScaler", "main_loss_backward_scale"),
               ("megatron.core.transformer.multi_token_prediction", "MTPLossAutoScaler", "main_loss_backward_scale"))
_CLASS_DEFAULTS: list = []
# closures that megatron-core registers on autograd nodes (see _reset_framework_state)
CYCLE_HOOKS = {"DistributedDataParallel._make_backward_post_hook.<locals>.hook"}
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2)


def _write_json(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _exit_code(exc: SystemExit) -> int:
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


def run_argv(argv: list[str]) -> int:
    """Run a python command line (`-m module ...`, `-c code ...` or `script.py ...`) in this process."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python script.py` does
            try:
                runpy.run_path(argv[0], run_name="__main__")
            finally:
                sys.path.pop(0)
    except SystemExit as exc:
        return _exit_code(exc)
    except BaseException:  # what the interpreter would print before exiting 1
        traceback.print_exc()
        return 1
    return 0


class _Redirect:
    """File descriptors 1 and 2 (and Python's streams, which write to them) into two files."""

    def __init__(self, out: Path, err: Path):
        self.paths = (out, err)

    def __enter__(self):
        sys.stdout.flush()
        sys.stderr.flush()
        self.saved = (os.dup(1), os.dup(2))
        for fd, path in zip((1, 2), self.paths):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(target, fd)
            os.close(target)
        return self

    def __exit__(self, *exc):
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, saved in zip((1, 2), self.saved):
            os.dup2(saved, fd)
            os.close(saved)
        return False


def _reset_framework_state(groups_before: set) -> None:
    """Undo what one command left in megatron-core's and torch.distributed's process-wide state."""
    import gc

    import torch
    import torch.distributed as dist

    modules = sys.modules
    if "megatron.core.parallel_state" in modules:
        ps = modules["megatron.core.parallel_state"]
        if ps.model_parallel_is_initialized():
            ps.destroy_model_parallel()
        # destroy_model_parallel leaves a few group globals set (_INTRA_PARTIAL_DATA_PARALLEL_GROUP_WITH_CP in
        # 0.16): each would keep its gloo threads alive for the rest of the session
        for name, value in list(vars(ps).items()):
            if isinstance(value, dist.ProcessGroup):
                setattr(ps, name, None)
    if "megatron.core.num_microbatches_calculator" in modules:
        modules["megatron.core.num_microbatches_calculator"].destroy_num_microbatches_calculator()
    if "megatron.core.rerun_state_machine" in modules:
        modules["megatron.core.rerun_state_machine"].destroy_rerun_state_machine()
    if "megatron.core.tensor_parallel.random" in modules:
        rng = modules["megatron.core.tensor_parallel.random"]
        rng._CUDA_RNG_STATE_TRACKER, rng._CUDA_RNG_STATE_TRACKER_INITIALIZED = None, False
    if "megatron.core.transformer.moe.moe_utils" in modules:
        from megatron_mtp.platform.megatron_core import reset_moe_tracker

        reset_moe_tracker()
    if "megatron.core.transformer.multi_token_prediction" in modules:
        modules["megatron.core.transformer.multi_token_prediction"].MTPLossLoggingHelper.tracker = {}
    dsa = "megatron.core.transformer.experimental_attention_variant.dsa"
    if dsa in modules:  # 0.19's indexer-loss tracker: sized by the first DSA model's layers, and kept
        modules[dsa].DSAIndexerLossLoggingHelper.tracker = {}
    # megatron-core's DDP hooks each parameter's gradient accumulator with a closure over the DDP: a cycle
    # through C++ autograd nodes that the garbage collector cannot see. Empty those closures, or every model
    # (and every process group it holds, with their gloo threads) lives on for the rest of the session.
    # and megatron-core's method caches (RotaryEmbedding.forward, ...) keep their instances alive
    for obj in gc.get_objects():
        if (isinstance(obj, types.FunctionType) and obj.__qualname__ in CYCLE_HOOKS and obj.__closure__):
            for cell in obj.__closure__:
                cell.cell_contents = None
        elif isinstance(obj, functools._lru_cache_wrapper) and obj.__module__.startswith("megatron.core"):
            obj.cache_clear()
    if dist.is_initialized():
        from torch.distributed import distributed_c10d as c10d

        for group in [g for g in list(c10d._world.pg_map) if g not in groups_before]:
            dist.destroy_process_group(group)
    for cls, attr, value in _CLASS_DEFAULTS:
        setattr(cls, attr, value)
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    torch.set_num_threads(_THREADS)
    gc.enable()  # training.manual_gc_interval disables it while it runs
    gc.collect()
    try:  # hand freed heap back to the system, so a long-lived rank stays near one command's size
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _run_request(request: dict, rank: int, out_dir: Path, groups_before: set) -> dict:
    job = {k: os.environ[k] for k in JOB_VARS if k in os.environ}
    saved_env, saved_cwd = dict(os.environ), os.getcwd()
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    os.environ.clear()
    os.environ.update({**request["env"], **job})
    start = time.perf_counter()
    try:
        os.chdir(request["cwd"])
        with _Redirect(out_dir / f"rank-{rank}.out", out_dir / f"rank-{rank}.err"):
            code = run_argv(request["argv"])
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_env)
        for s, h in handlers.items():
            signal.signal(s, h)
        _reset_framework_state(groups_before)
    return {"returncode": code, "seconds": time.perf_counter() - start, "rss_bytes": _rss_bytes(),
            "threads": len(os.listdir("/proc/self/task"))}


def main() -> None:
    global _THREADS
    import torch

    _THREADS = torch.get_num_threads()
    import importlib

    for module, name, attr in CLASS_STATE:
        cls = getattr(importlib.import_module(module), name)
        _CLASS_DEFAULTS.append((cls, attr, getattr(cls, attr)))
    inbox = Path(sys.argv[1])
    rank = int(os.environ["RANK"])
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=6))
    # waiting for the next request can take as long as the tests between two requests
    wait_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(hours=6))
    groups_before = set(__import__("torch.distributed.distributed_c10d", fromlist=["_world"])._world.pg_map)
    pid_tmp = inbox / f"pid-{rank}.tmp"  # published whole: the pool reads it while the rank starts
    pid_tmp.write_text(str(os.getpid()))
    os.replace(pid_tmp, inbox / f"pid-{rank}")
    owner = int(os.environ.get("WORKER_POOL_OWNER", "0"))
    n = 0
    while True:
        request = None
        if rank == 0:
            path = inbox / f"req-{n}.json"
            while not path.exists():
                if owner and not _alive(owner):  # the test session is gone
                    request = {"stop": True}
                    break
                time.sleep(0.005)
            if request is None:
                request = json.loads(path.read_text())
        box = [request]
        dist.broadcast_object_list(box, src=0, group=wait_group)
        request = box[0]
        if request.get("stop"):
            break
        out_dir = inbox / str(n)
        out_dir.mkdir(exist_ok=True)
        result = _run_request(request, rank, out_dir, groups_before)
        _write_json(out_dir / f"rank-{rank}.json", result)  # the pool waits for every rank's file
        n += 1
    dist.destroy_process_group()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


if __name__ == "__main__":
    main()
