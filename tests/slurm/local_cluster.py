"""A real Slurm cluster on this machine for tests: munged, slurmctld and two slurmd (node1, node2).

Everything lives under one temporary directory (keys, sockets, state, spool, logs, slurm.conf) and
on free TCP ports, so it never touches a system Slurm or munge and several can run side by side.
Clients reach it through ``SLURM_CONF`` (see ``LocalSlurmCluster.env``). The node names resolve
inside jobs because each slurmd starts in its own mount namespace with a private hosts file
bind-mounted over /etc/hosts (jobs inherit the namespace). Only where mount namespaces are not
allowed (some containers) is a marked line appended to /etc/hosts, and stop() removes it.
``stop`` cancels the cluster's jobs and ends exactly the daemons this object started (by the pids
in its own pid files).

Needs root (slurmd starts jobs as their owner). If the Slurm or munge programs are missing and we
are root on Debian, they are installed with apt-get; otherwise ``ClusterUnavailable`` says why, and
the pytest fixture turns that into a skip.

Run by hand: ``python tests/slurm/local_cluster.py`` starts one and prints its SLURM_CONF.
"""

from __future__ import annotations

import atexit
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from typing import Optional

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
PROGRAMS = ["sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo", "slurmctld", "slurmd", "munged"]
NODES = ("node1", "node2")
CPUS_PER_NODE = 4


class ClusterUnavailable(RuntimeError):
    """The cluster cannot run on this machine; the message says why (used as a pytest skip reason)."""


def ensure_slurm_installed() -> None:
    """Install Debian's Slurm and munge packages when a program is missing (root + apt-get only)."""
    missing = [p for p in PROGRAMS if _which(p) is None]
    if not missing:
        return
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        raise ClusterUnavailable(
            f"Slurm programs {', '.join(missing)} are missing and cannot be installed here (needs root and apt-get)"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    proc = subprocess.run(install, env=env, capture_output=True, text=True)
    if proc.returncode != 0:  # package lists may be missing on a fresh machine
        subprocess.run(["apt-get", "update", "-q"], env=env, capture_output=True, text=True)
        proc = subprocess.run(install, env=env, capture_output=True, text=True)
    still = [p for p in PROGRAMS if _which(p) is None]
    if proc.returncode != 0 or still:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ClusterUnavailable(f"installing {' '.join(PACKAGES)} with apt-get failed: {tail[0]}")


def _which(program: str) -> Optional[str]:
    return shutil.which(program) or shutil.which(program, path="/usr/sbin:/sbin:/usr/bin:/bin")


def _free_ports(count: int) -> list[int]:
    sockets, ports = [], []
    for _ in range(count):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        sockets.append(s)
        ports.append(s.getsockname()[1])
    for s in sockets:
        s.close()
    return ports


class LocalSlurmCluster:
    """Start with ``start()``, stop with ``stop()``; ``env()`` gives a client environment."""

    def __init__(self, root: Optional[str] = None) -> None:
        self.root = root or tempfile.mkdtemp(prefix="mtp-slurm-")
        self.conf = os.path.join(self.root, "slurm.conf")
        self.hostname = socket.gethostname().split(".")[0]
        self._pid_files: list[str] = []
        self._hosts_line: Optional[str] = None
        self.private_hosts = True
        self.started = False

    # ------------------------------------------------------------------ lifecycle

    def start(self, timeout: float = 60.0) -> "LocalSlurmCluster":
        if os.geteuid() != 0:
            raise ClusterUnavailable("the local Slurm cluster needs root (slurmd launches jobs as their owner)")
        ensure_slurm_installed()
        self.private_hosts = _private_mounts_work()
        atexit.register(self.stop)  # also when the test process ends without running its fixtures' teardown
        os.chmod(self.root, 0o755)  # munged (user munge) must traverse it
        try:
            self._start_munge()
            self._write_conf()
            self._start_daemons()
            self._wait_idle(timeout)
        except BaseException:
            self.stop()
            raise
        self.started = True
        return self

    def stop(self) -> None:
        """Cancel this cluster's jobs, then end the daemons it started (TERM, then KILL)."""
        if os.path.exists(self.conf) and self._daemon_pids():
            subprocess.run([_which("scancel") or "scancel", "--full", "-u", pwd.getpwuid(os.geteuid()).pw_name],
                           env=self.env(), capture_output=True, timeout=30)
            deadline = time.time() + 15
            while time.time() < deadline and self.squeue():
                time.sleep(0.5)
        pids = self._daemon_pids()
        for pid in pids:
            _signal(pid, signal.SIGTERM)
        deadline = time.time() + 10
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.2)
        for pid in pids:
            if _alive(pid):
                _signal(pid, signal.SIGKILL)
        self._remove_hosts_line()
        self.started = False

    # ------------------------------------------------------------------ client helpers

    def env(self, base: Optional[dict[str, str]] = None) -> dict[str, str]:
        env = dict(os.environ if base is None else base)
        env["SLURM_CONF"] = self.conf
        for key in [k for k in env if k.startswith(("SLURM_", "SBATCH_", "SRUN_", "SQUEUE_")) and k != "SLURM_CONF"]:
            del env[key]
        sbin = "/usr/sbin:/sbin"
        env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":" + sbin
        return env

    def run(self, *args: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(args), env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc

    def squeue(self) -> list[str]:
        proc = self.run("squeue", "-h", "-o", "%i %T", check=False)
        return [line for line in proc.stdout.splitlines() if line.strip()]

    def job(self, job_id: str) -> dict[str, str]:
        """``scontrol show job`` fields (JobState, Restarts, ExitCode, NodeList...); {} once purged."""
        proc = self.run("scontrol", "show", "job", "-o", str(job_id), check=False)
        if proc.returncode != 0:
            return {}
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))

    def wait_for(self, job_id: str, predicate, timeout: float, what: str) -> dict[str, str]:
        """Poll the job until ``predicate(fields)`` holds; AssertionError with the job state if not."""
        deadline = time.time() + timeout
        fields: dict[str, str] = {}
        while time.time() < deadline:
            fields = self.job(job_id)
            if fields and predicate(fields):
                return fields
            time.sleep(0.5)
        raise AssertionError(
            f"job {job_id} did not reach '{what}' in {timeout:.0f} s; "
            f"last state {fields.get('JobState')} restarts={fields.get('Restarts')}"
        )

    def logs(self) -> str:
        """The daemons' log tails (for failure messages)."""
        parts = []
        for name in sorted(os.listdir(os.path.join(self.root, "log"))):
            with open(os.path.join(self.root, "log", name), errors="replace") as fh:
                parts.append(f"--- {name}\n" + "".join(fh.readlines()[-15:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ internals

    def _start_munge(self) -> None:
        key_dir = os.path.join(self.root, "munge")
        run_dir = os.path.join(self.root, "munge-run")
        os.makedirs(key_dir, mode=0o700, exist_ok=True)
        os.makedirs(run_dir, mode=0o755, exist_ok=True)
        key = os.path.join(key_dir, "munge.key")
        with open(key, "wb") as fh:
            fh.write(os.urandom(1024))
        os.chmod(key, 0o600)
        self.munge_socket = os.path.join(run_dir, "munge.socket")
        pid_file = os.path.join(run_dir, "munged.pid")
        cmd = [_which("munged"), f"--key-file={key}", f"--socket={self.munge_socket}", f"--pid-file={pid_file}",
               f"--log-file={key_dir}/munged.log", f"--seed-file={key_dir}/munged.seed"]
        try:
            munge_user = pwd.getpwnam("munge")
        except KeyError:
            munge_user = None
        if munge_user is not None:  # munged refuses to run as root without --force
            for path in (key_dir, run_dir, key):
                os.chown(path, munge_user.pw_uid, munge_user.pw_gid)
            cmd = ["runuser", "-u", "munge", "--", *cmd]
        else:
            cmd.append("--force")
        self._pid_files.append(pid_file)
        self._daemon("munged", cmd, pid_file)

    def _write_conf(self) -> None:
        ctld_port, node1_port, node2_port = _free_ports(3)
        for sub in ("state", "log", *(f"spool-{n}" for n in NODES)):
            os.makedirs(os.path.join(self.root, sub), exist_ok=True)
        r = self.root
        nodes = "\n".join(
            f"NodeName={name} NodeHostname={self.hostname} NodeAddr=127.0.0.1 Port={port} "
            f"CPUs={CPUS_PER_NODE} State=UNKNOWN"
            for name, port in zip(NODES, (node1_port, node2_port))
        )
        text = f"""# Local two-node test cluster (tests/slurm/local_cluster.py); everything under {r}.
ClusterName=mtptest
SlurmctldHost={self.hostname}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
# cred_expire=10: a requeued job may start again after 10 s instead of 120 s.
AuthInfo=socket={self.munge_socket},cred_expire=10
StateSaveLocation={r}/state
SlurmdSpoolDir={r}/spool-%n
SlurmctldPidFile={r}/slurmctld.pid
SlurmdPidFile={r}/slurmd-%n.pid
SlurmctldLogFile={r}/log/slurmctld.log
SlurmdLogFile={r}/log/slurmd-%n.log
# No cgroups here: process groups track job processes.
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
MailProg=/bin/true
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
ReturnToService=2
SchedulerParameters=batch_sched_delay=0,bf_interval=1,sched_interval=1
KillWait=10
MinJobAge=300
{nodes}
PartitionName=debug Nodes={','.join(NODES)} Default=YES MaxTime=INFINITE State=UP
"""
        with open(self.conf, "w") as fh:
            fh.write(text)
        with open(os.path.join(self.root, "hosts"), "w") as fh:
            fh.write(f"127.0.0.1 localhost\n127.0.0.1 {self.hostname} {' '.join(NODES)}\n::1 localhost ip6-localhost\n")

    def _start_daemons(self) -> None:
        ctld_pid = os.path.join(self.root, "slurmctld.pid")
        self._pid_files.append(ctld_pid)
        self._daemon("slurmctld", [_which("slurmctld"), "-f", self.conf], ctld_pid)
        hosts = os.path.join(self.root, "hosts")
        if not self.private_hosts:
            self._add_hosts_line()
        for node in NODES:
            pid_file = os.path.join(self.root, f"slurmd-{node}.pid")
            self._pid_files.append(pid_file)
            slurmd = [_which("slurmd"), "-f", self.conf, "-N", node]
            if self.private_hosts:
                inner = f"mount --bind {hosts} /etc/hosts && exec {' '.join(slurmd)}"
                slurmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", inner]
            self._daemon(f"slurmd {node}", slurmd, pid_file)

    def _add_hosts_line(self) -> None:
        """Fallback without mount namespaces: a marked /etc/hosts line, removed again by stop()."""
        if all(_resolves(n) for n in NODES):
            return
        self._hosts_line = f"127.0.0.1 {' '.join(NODES)}  # megatron-mtp test cluster {self.root}\n"
        with open("/etc/hosts", "a") as fh:
            fh.write(self._hosts_line)

    def _remove_hosts_line(self) -> None:
        if self._hosts_line is None:
            return
        with open("/etc/hosts") as fh:
            lines = fh.readlines()
        with open("/etc/hosts", "w") as fh:  # rewritten in place: /etc/hosts may be a bind mount
            fh.writelines(line for line in lines if line != self._hosts_line)
        self._hosts_line = None

    def _daemon(self, name: str, cmd: list[str], pid_file: str) -> None:
        """Run a self-daemonizing program and wait for its pid file."""
        proc = subprocess.run(cmd, env=self.env(), stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
        if proc.returncode != 0:
            raise ClusterUnavailable(f"{name} did not start ({(proc.stderr or proc.stdout).strip()[-300:]})")
        deadline = time.time() + 20
        while time.time() < deadline:
            if os.path.exists(pid_file) and _read_pid(pid_file) and _alive(_read_pid(pid_file)):
                return
            time.sleep(0.1)
        raise ClusterUnavailable(f"{name} started but wrote no pid file at {pid_file}")

    def _daemon_pids(self) -> list[int]:
        pids = [_read_pid(f) for f in reversed(self._pid_files) if os.path.exists(f)]
        return [p for p in pids if p and _alive(p)]

    def _wait_idle(self, timeout: float) -> None:
        deadline = time.time() + timeout
        last = ""
        while time.time() < deadline:
            proc = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False)
            last = proc.stdout.strip() or proc.stderr.strip()
            states = dict(line.split() for line in proc.stdout.splitlines() if len(line.split()) == 2)
            if all(states.get(n) == "idle" for n in NODES):
                return
            time.sleep(0.5)
        raise ClusterUnavailable(f"the nodes did not become idle in {timeout:.0f} s (sinfo: {last})")


def _private_mounts_work() -> bool:
    """Whether `unshare --mount` can give slurmd a private /etc/hosts (not in some containers)."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"], capture_output=True)
    return probe.returncode == 0


def _resolves(name: str) -> bool:
    try:
        socket.gethostbyname(name)
        return True
    except OSError:
        return False


def _read_pid(path: str) -> Optional[int]:
    try:
        with open(path) as fh:
            text = fh.read().strip()
        return int(text) if text else None
    except (OSError, ValueError):
        return None


def _alive(pid: int) -> bool:
    """True while the process runs (zombies, left when nothing reaps daemons, count as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


if __name__ == "__main__":
    cluster = LocalSlurmCluster().start()
    print(
        f"export SLURM_CONF={cluster.conf}\n"
        f"# stop: kill the pids in {cluster.root}/*.pid {cluster.root}/munge-run/munged.pid"
    )
