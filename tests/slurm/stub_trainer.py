#!/usr/bin/env python3
"""A trivial stand-in for `python -m megatron_mtp train CONFIG --run-dir DIR` (tests only).

It follows the trainer's process contract without torch, so the Slurm machinery (rendezvous
variables, per-rank logs, signal forwarding, exit 75 -> requeue -> resume) can be tested in
seconds: every rank records its environment, counts "steps" (0.2 s each) into
RUN_DIR/stub/progress-RANK, and on SIGUSR1/SIGTERM saves the step it reached and exits 75;
rerun, it resumes from the saved step and exits 0 at STUB_STEPS (default 40).
"""

import json
import os
import signal
import socket
import sys
import time


def main(argv: list[str]) -> int:
    if argv[:2] == ["-m", "megatron_mtp.launch.env_check"]:
        # the job's environment check: the real one, run by the interpreter the test names
        # (STUB_CHECK_PYTHON, exported by submit_helpers.submit_cli) on this checkout
        python = os.environ["STUB_CHECK_PYTHON"]
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        env = dict(os.environ, PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
        os.execve(python, [python, *argv], env)
    assert argv[:3] == ["-m", "megatron_mtp", "train"], argv
    run_dir = argv[argv.index("--run-dir") + 1]
    rank = int(os.environ["RANK"])
    # STUB_SLOW_START=S: S seconds of "start-up" before the signal handlers exist (like importing torch)
    time.sleep(float(os.environ.get("STUB_SLOW_START", "0")))
    out = os.path.join(run_dir, "stub")
    os.makedirs(out, exist_ok=True)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "SLURMD_NODENAME", "SLURM_RESTART_COUNT", "SLURM_JOB_ID", "OMP_NUM_THREADS", "STUB_FLAVOUR")
    info = {k: os.environ.get(k) for k in keys}
    info["master_resolves"] = socket.gethostbyname(os.environ["MASTER_ADDR"])
    info["config"] = argv[3]
    with open(os.path.join(out, f"env-{rank}-{os.environ.get('SLURM_RESTART_COUNT', '0')}.json"), "w") as fh:
        json.dump(info, fh)
    state = os.path.join(out, f"step-{rank}")
    step = int(open(state).read()) if os.path.exists(state) else 0
    start = step
    stop = {"flag": False}
    signal.signal(signal.SIGUSR1, lambda *_: stop.update(flag=True))
    signal.signal(signal.SIGTERM, lambda *_: stop.update(flag=True))
    total = int(os.environ.get("STUB_STEPS", "40"))
    print(f"stub rank {rank} starts at step {start} (SLURM_RESTART_COUNT={info['SLURM_RESTART_COUNT']})", flush=True)
    crash_at = int(os.environ.get("STUB_CRASH_AT", "0"))  # rank 1 of the first attempt dies there (kill -9)
    while step < total:
        time.sleep(0.2)
        step += 1
        if crash_at and step == crash_at and rank == 1 and info["SLURM_RESTART_COUNT"] in (None, "0"):
            os.kill(os.getpid(), signal.SIGKILL)
        with open(os.path.join(out, f"progress-{rank}"), "a") as fh:
            fh.write(f"{step}\n")
        if stop["flag"]:
            with open(state, "w") as fh:
                fh.write(str(step))
            print(f"stub rank {rank} saved at step {step}", flush=True)
            return 75
    with open(state, "w") as fh:
        fh.write(str(step))
    print(f"stub rank {rank} finished at step {step}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
