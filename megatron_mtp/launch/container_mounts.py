"""Pyxis container mounts: parsing ``--container-mounts`` and mapping host paths into the container.

Paths in a config are checked on the submit host, but the job runs inside the container, where a
host directory may appear under another name (``/lustre/me:/workspace``). Every path the job needs
(run directory, config snapshot, data, tokenizer, checkpoint to load) must therefore lie under the
source of some mount; we rewrite it to the container-side path in the job script and in the config
snapshot. The user's home directory counts as mounted at the same path (pyxis mounts it by
default).
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Optional

from megatron_mtp.config import Config
from megatron_mtp.errors import UserError

_FLAGS = {
    "ro", "rw", "rbind", "bind", "private", "rprivate", "slave", "rslave", "shared", "rshared",
    "x-create=file", "x-create=dir",
}


@dataclass(frozen=True)
class Mount:
    source: str
    """Absolute host path."""
    target: str
    """Absolute path inside the container."""
    flags: str = ""
    """Pyxis mount flags such as ``ro`` (kept verbatim)."""

    def spec(self) -> str:
        text = f"{self.source}:{self.target}"
        return f"{text}:{self.flags}" if self.flags else text


def parse_mounts(items: list[str]) -> list[Mount]:
    """Parse ``SRC[:DST[:FLAGS]]`` entries (each item may hold several, comma-separated)."""
    mounts: list[Mount] = []
    for item in items:
        for entry in filter(None, (e.strip() for e in item.split(","))):
            parts = entry.split(":")
            if len(parts) > 3 or not parts[0]:
                raise UserError(f"--container-mounts entry '{entry}' must look like /host/path[:/container/path[:ro]]")
            source = parts[0]
            target = parts[1] if len(parts) > 1 and parts[1] else source
            flags = parts[2] if len(parts) > 2 else ""
            if len(parts) == 2 and parts[1] in _FLAGS:  # SRC:FLAGS is not valid pyxis syntax
                raise UserError(
                    f"--container-mounts entry '{entry}' gives flags without a container path; "
                    f"write {source}:{source}:{parts[1]}"
                )
            if not os.path.isabs(source) or not os.path.isabs(target):
                raise UserError(f"--container-mounts entry '{entry}' must use absolute paths on both sides")
            if not os.path.exists(source):
                raise UserError(
                    f"--container-mounts source '{source}' does not exist on this machine; fix the path or create it"
                )
            mounts.append(Mount(os.path.normpath(source), os.path.normpath(target), flags))
    return mounts


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def container_path(host_path: str, mounts: list[Mount], home: Optional[str]) -> Optional[str]:
    """Where ``host_path`` appears inside the container, or None if no mount covers it.

    The most specific (longest) mount source wins, as in a real mount table.
    """
    path = os.path.normpath(os.path.abspath(host_path))
    best: Optional[Mount] = None
    for mount in mounts:
        if _under(path, mount.source) and (best is None or len(mount.source) > len(best.source)):
            best = mount
    if best is None:
        if home and _under(path, os.path.normpath(home)):
            return path
        return None
    return os.path.normpath(best.target + path[len(best.source):])


def into_container(cfg: Config, run_dir: str, workdir: str, mounts: list[Mount]) -> tuple[Config, str, str]:
    """Rewrite every path the job uses to its container-side name; UserError if one is not mounted."""
    home = os.path.expanduser("~")

    def inside(path: str, what: str, writable: bool = False) -> str:
        target = container_path(path, mounts, home)
        if target is None:
            raise UserError(
                f"{what} '{path}' is not under any --container-mounts source, so the job could not see it; "
                f"add a mount such as {os.path.dirname(os.path.abspath(path))}:"
                f"{os.path.dirname(os.path.abspath(path))}"
            )
        if writable:
            for m in mounts:
                if "ro" in m.flags.split("+") and (os.path.abspath(path) + "/").startswith(m.source.rstrip("/") + "/"):
                    raise UserError(
                        f"{what} '{path}' is under the read-only mount {m.spec()}; "
                        "the job must write there, so mount it read-write"
                    )
        return target

    job_cfg = copy.deepcopy(cfg)
    d = job_cfg.data
    d.paths = [inside(p, "data.paths entry") for p in d.paths] if d.paths else d.paths
    d.valid_paths = [inside(p, "data.valid_paths entry") for p in d.valid_paths] if d.valid_paths else d.valid_paths
    if d.tokenizer is not None:
        d.tokenizer = inside(d.tokenizer, "data.tokenizer")
    if d.cache_dir is not None:
        d.cache_dir = inside(d.cache_dir, "data.cache_dir", writable=True)
    if job_cfg.checkpoint.load is not None:
        job_cfg.checkpoint.load = inside(job_cfg.checkpoint.load, "checkpoint.load")
    job_run_dir = inside(run_dir, "run directory", writable=True)
    job_workdir = container_path(workdir, mounts, home) or job_run_dir
    return job_cfg, job_run_dir, job_workdir
