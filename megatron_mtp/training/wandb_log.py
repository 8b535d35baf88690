"""Weights & Biases beside TensorBoard (logging.wandb_project, or WANDB_PROJECT): the same scalars, the run's
config attached, and a resumed run continuing the same W&B run.

Design note. Rank 0 opens one W&B run per run directory: its id is kept in RUN_DIR/logs/wandb_run_id,
so every restart, requeue and resume logs into the same run (W&B's resume="allow"). A step an earlier
attempt logged but never saved is replayed after a resume; W&B keeps the first value of a step, so the
replayed steps (which train the same data from the same state) are not logged twice. The `wandb`
package is the optional `wandb` extra, imported only when W&B is on. Project, entity, mode and directory are
the config's, else the environment's (config/wandb_env.py): WANDB_MODE=offline writes WANDB_DIR/wandb/ (by
default RUN_DIR/wandb/) without a network, for `wandb sync` later, which is what the tests use. Online needs
an API key, which ``check_credentials`` looks for on every rank before the process groups start, without a
network, where W&B itself looks: WANDB_API_KEY, WANDB_IDENTITY_TOKEN_FILE, or the netrc entry `wandb login`
writes for the W&B host.
"""

from __future__ import annotations

import configparser
import netrc
import os
import secrets
from pathlib import Path
from typing import Mapping
from urllib.parse import urlparse

from megatron_mtp.config.wandb_env import WandbOptions, wandb_options
from megatron_mtp.errors import RunError, UserError

ID_FILE = Path("logs") / "wandb_run_id"


def check_credentials(cfg, run_dir: Path, environ: Mapping[str, str] = os.environ) -> None:
    """One sentence (on every rank, printed once) when W&B would log online with no API key on this machine."""
    options = wandb_options(cfg.logging, run_dir, environ)
    if options is None or options.mode != "online" or has_api_key(environ):
        return
    raise RunError(f"W&B logging is on ({options.project_from}={options.project}) and online, but this machine has "
                   "no W&B API key (WANDB_API_KEY, or the ~/.netrc entry `wandb login` writes); set one, or log "
                   "offline with WANDB_MODE=offline (or logging.wandb_mode=offline) and upload later with `wandb sync`")


def has_api_key(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether W&B would find credentials here (module note); reads files only, no network."""
    if environ.get("WANDB_API_KEY") or environ.get("WANDB_IDENTITY_TOKEN_FILE"):
        return True
    home = Path(environ.get("HOME") or Path.home())
    path = Path(environ["NETRC"]).expanduser() if environ.get("NETRC") else next(
        (p for p in (home / ".netrc", home / "_netrc") if p.is_file()), home / ".netrc")
    try:
        hosts = netrc.netrc(str(path)).hosts
    except (OSError, netrc.NetrcParseError):
        return False
    return any(hosts.get(host, (None, None, None))[2] for host in _hosts(environ, home))


def _hosts(environ: Mapping[str, str], home: Path) -> set[str]:
    """The W&B server hosts a netrc entry may be for: WANDB_BASE_URL's, `wandb login --host`'s settings, and the
    W&B's public server and the installed wandb's default."""
    urls = [environ.get("WANDB_BASE_URL")]
    settings = configparser.ConfigParser()
    config_dir = Path(environ.get("WANDB_CONFIG_DIR") or home / ".config" / "wandb")
    settings.read([config_dir / "settings", Path("wandb") / "settings"])
    urls += [settings.get("default", "base_url", fallback=None), "https://api.wandb.ai"]
    try:
        from wandb.sdk.lib.urls import DEFAULT_BASE_URL

        urls.append(DEFAULT_BASE_URL)
    except ImportError:  # a wandb release without it
        pass
    return {urlparse(url).hostname for url in urls if url}


class WandbRun:
    def __init__(self, cfg, run_dir: Path, options: WandbOptions):
        try:
            import wandb
        except ImportError:
            raise UserError(f"{options.project_from} is set (W&B logging) but the 'wandb' package is not installed; "
                            f"install it with pip install 'megatron-mtp[wandb]' or unset {options.project_from}") \
                from None
        id_path = run_dir / ID_FILE
        run_id = id_path.read_text().strip() if id_path.is_file() else secrets.token_hex(4)
        self.last_step = 0
        options.dir.mkdir(parents=True, exist_ok=True)
        self.run = wandb.init(project=options.project, entity=options.entity, name=cfg.logging.wandb_name or cfg.name,
                              id=run_id, resume="allow", dir=str(options.dir), mode=options.mode,
                              config=cfg.to_dict(), settings=wandb.Settings(quiet=True))
        if not id_path.is_file():
            id_path.parent.mkdir(parents=True, exist_ok=True)
            tmp = id_path.with_name(id_path.name + f".tmp-{os.getpid()}")
            tmp.write_text(run_id + "\n")
            os.replace(tmp, id_path)

    def log(self, step: int, values: dict[str, float]) -> None:
        if step <= self.last_step:
            return
        self.run.log(values, step=step)
        self.last_step = step

    def finish(self) -> None:
        self.run.finish()
