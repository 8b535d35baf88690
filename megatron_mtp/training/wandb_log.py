"""Weights & Biases beside TensorBoard (logging.wandb_project): the same scalars, the run's config
attached, and a resumed run continuing the same W&B run.

Design note. Rank 0 opens one W&B run per run directory: its id is kept in RUN_DIR/logs/wandb_run_id,
so every restart, requeue and resume logs into the same run (W&B's resume="allow"). A step an earlier
attempt logged but never saved is replayed after a resume; W&B keeps the first value of a step, so the
replayed steps (which train the same data from the same state) are not logged twice. The `wandb`
package is the optional `wandb` extra, imported only when a project is set; `wandb_mode=offline`
writes RUN_DIR/wandb/ without a network (`wandb sync` uploads it later), which is what the tests use.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from megatron_mtp.errors import UserError

ID_FILE = Path("logs") / "wandb_run_id"


class WandbRun:
    def __init__(self, cfg, run_dir: Path):
        try:
            import wandb
        except ImportError:
            raise UserError("logging.wandb_project is set but the 'wandb' package is not installed; install it "
                            "with pip install 'megatron-mtp[wandb]' or unset logging.wandb_project") from None
        lg = cfg.logging
        id_path = run_dir / ID_FILE
        run_id = id_path.read_text().strip() if id_path.is_file() else secrets.token_hex(4)
        self.last_step = 0
        self.run = wandb.init(project=lg.wandb_project, entity=lg.wandb_entity, name=lg.wandb_name or cfg.name,
                              id=run_id, resume="allow", dir=str(run_dir), mode=lg.wandb_mode,
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
