"""Everything a rank needs to train or evaluate, built in a fixed order.

    config checks -> data resolution (default corpus, tokenizer) -> platform -> process groups
    -> model/optimizer -> checkpoint (resume or checkpoint.load) -> datasets at the resumed position
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from megatron_mtp.config import Config
from megatron_mtp.config.validate import validate, validate_vocab
from megatron_mtp.errors import UserError
from megatron_mtp.platform import Platform
from megatron_mtp.platform import setup as setup_platform
from megatron_mtp.training import checkpointing as ckpt_io
from megatron_mtp.training.distributed import Layout, env_world, init_distributed
from megatron_mtp.training.setup import Components, TrainState, build_components


@dataclass
class Session:
    cfg: Config
    platform: Platform
    layout: Layout
    components: Components
    state: TrainState
    train_dataset: Any
    valid_dataset: Any
    tokenizer_path: Optional[str]
    tokenizer: Any
    loaded_from: Optional[Path]


def _with_vocab(cfg: Config, tokenizer) -> Config:
    if cfg.model.vocab_size is not None:
        validate_vocab(cfg, tokenizer.vocab_size)
        return cfg
    return cfg.replace(model=dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))


def open_training(cfg: Config, run_dir: Path) -> Session:
    from megatron_mtp.data.datasets import build_datasets, check_data_config, resolve_data
    from megatron_mtp.models.deepseek_v3.model import padded_vocab_size

    _, world = env_world()
    validate(cfg, world)
    resolved = resolve_data(cfg)
    cfg = _with_vocab(cfg, resolved.tokenizer)
    check_data_config(cfg, resolved)
    platform = setup_platform(cfg.training.device, cfg.parallel.backend, cfg.training.fp8)
    layout = init_distributed(cfg, platform)
    comp = build_components(cfg, platform, padded_vocab_size(cfg.model.vocab_size, cfg))

    state, loaded_from = TrainState(), None
    own = ckpt_io.resolve_checkpoint(run_dir)
    if own is not None:
        state = ckpt_io.load_checkpoint(own, comp, layout, load_optimizer=True)
        loaded_from = own
    elif cfg.checkpoint.load:
        src = ckpt_io.resolve_checkpoint(cfg.checkpoint.load)
        if src is None:
            raise UserError(f"checkpoint.load={cfg.checkpoint.load} holds no checkpoint (no latest file or "
                            "train_state.json); point it at a run directory or a step_* directory")
        state = ckpt_io.load_checkpoint(src, comp, layout, load_optimizer=cfg.checkpoint.load_optimizer)
        loaded_from = src

    t = cfg.training
    train_samples = t.max_steps * t.global_batch_size
    evals = (t.max_steps // cfg.logging.eval_interval + 1) if cfg.logging.eval_interval else 1
    valid_samples = evals * cfg.logging.eval_steps * t.global_batch_size
    train_ds, valid_ds = build_datasets(cfg, resolved, train_samples, valid_samples)
    return Session(cfg, platform, layout, comp, state, train_ds, valid_ds, resolved.tokenizer_path,
                   resolved.tokenizer, loaded_from)


def open_checkpoint_for_eval(ckpt: Path, cfg: Config) -> Session:
    """Model (no optimizer) loaded from `ckpt`, at the layout of the processes launched now."""
    from megatron_mtp.data.tokenizer import load_tokenizer
    from megatron_mtp.models.deepseek_v3.model import padded_vocab_size

    _, world = env_world()
    validate(cfg, world)
    tok_dir = ckpt / ckpt_io.TOKENIZER_DIR
    tokenizer = load_tokenizer(tok_dir) if tok_dir.exists() else None
    platform = setup_platform(cfg.training.device, cfg.parallel.backend, cfg.training.fp8)
    layout = init_distributed(cfg, platform)
    comp = build_components(cfg, platform, padded_vocab_size(cfg.model.vocab_size, cfg), with_optimizer=False)
    ckpt_io.load_checkpoint(ckpt, comp, layout, load_optimizer=False)
    return Session(cfg, platform, layout, comp, TrainState(), None, None,
                   str(tok_dir) if tokenizer else None, tokenizer, ckpt)
