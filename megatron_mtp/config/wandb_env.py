"""Which Weights & Biases run a config asks for: each W&B field of ``logging`` the config sets, else the
variable every W&B user sets for it (WANDB_PROJECT, WANDB_ENTITY, WANDB_MODE, WANDB_DIR), else W&B's default.

Design note. W&B reads those variables itself, but a value passed to ``wandb.init`` wins over them, so
the trainer passes only what the config sets, resolved here once (``wandb_options``) for the checks
before the ranks start (validate.py: the package; training/wandb_log.py: an API key when online) and for
``wandb.init``. W&B is on when a project is known (config or environment) and the mode is not disabled.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional

from megatron_mtp.errors import UserError

OFFLINE_MODES = {"offline": "offline", "dryrun": "offline", "online": "online", "run": "online"}
"""WANDB_MODE values W&B reads -> the mode they name (``disabled`` turns W&B off)."""


@dataclass(frozen=True)
class WandbOptions:
    project: str
    project_from: str
    """Where the project came from: logging.wandb_project or WANDB_PROJECT (messages name it)."""
    entity: Optional[str]
    mode: str
    """online or offline."""
    dir: Path
    """W&B writes its files under dir/wandb/."""


def wandb_options(lg, run_dir: Path, environ: Mapping[str, str] = os.environ) -> Optional[WandbOptions]:
    """The W&B run ``lg`` (a config's LoggingConfig) asks for in ``environ`` (module note); None: no W&B."""
    project = lg.wandb_project or environ.get("WANDB_PROJECT") or None
    mode = lg.wandb_mode or environ.get("WANDB_MODE") or "online"
    if project is None or mode == "disabled":
        return None
    if mode not in OFFLINE_MODES:
        raise UserError(f"WANDB_MODE is {mode!r}; W&B logging takes online, offline or disabled (set it so, or set "
                        "logging.wandb_mode)")
    return WandbOptions(project=project,
                        project_from="logging.wandb_project" if lg.wandb_project else "WANDB_PROJECT",
                        entity=lg.wandb_entity or environ.get("WANDB_ENTITY") or None, mode=OFFLINE_MODES[mode],
                        dir=Path(lg.wandb_dir or environ.get("WANDB_DIR") or run_dir))


def check_installed(lg) -> None:
    """W&B logging asked for needs the `wandb` package (one sentence before anything starts)."""
    options = wandb_options(lg, Path("."))
    if options is not None and importlib.util.find_spec("wandb") is None:
        raise UserError(f"{options.project_from} is set (W&B logging) but the 'wandb' package is not installed; "
                        f"install it with pip install 'megatron-mtp[wandb]' or unset {options.project_from}")
