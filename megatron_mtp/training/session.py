"""Everything a rank needs to train or evaluate, built in a fixed order.

    config checks -> data resolution (default corpus, tokenizer) -> platform -> process groups
    -> model/optimizer -> checkpoint (resume or checkpoint.load) -> datasets at the resumed position
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from megatron_mtp.checkpoint.info import check_optimizer_compatible, optimizer_layout, read_config, read_train_state
from megatron_mtp.checkpoint.resume_rules import refuse_load_changes, refuse_meaning_changes, refuse_tokenizer_change
from megatron_mtp.checkpoint.run_dir import (
    DAMAGED_DIR,
    TOKENIZER_DIR,
    find_checkpoint,
    resolve_checkpoint,
    set_aside_damaged,
)
from megatron_mtp.config import Config
from megatron_mtp.config.validate import validate
from megatron_mtp.config.vocab import padded_vocab_size
from megatron_mtp.errors import UserError, same_on_every_rank
from megatron_mtp.platform import Platform, all_reduce_sum, megatron_core
from megatron_mtp.platform import setup as setup_platform
from megatron_mtp.training import checkpoint_state as ckpt_io
from megatron_mtp.training.components import Components, TrainState, build_components, unwrap
from megatron_mtp.training.distributed import Ranks, env_world, init_distributed
from megatron_mtp.training.finite_weights import refuse_nonfinite_loaded_weights
from megatron_mtp.training.run_dir_claim import claim_run_dir, forget_claim, run_dir_state
from megatron_mtp.training.schedules import schedule_changes
from megatron_mtp.training.wandb_log import check_credentials


@dataclass
class Session:
    cfg: Config
    platform: Platform
    ranks: Ranks
    components: Components
    state: TrainState
    train_dataset: Any
    valid_dataset: Any
    tokenizer_path: Optional[str]
    tokenizer: Any
    loaded_from: Optional[Path]
    notes: list[str] = dataclasses.field(default_factory=list)
    """What the user should know about how the run started (a fallback checkpoint, a lock taken over)."""
    lock: Any = None
    """The run lock (rank 0 of a training session)."""
    data_line: str = ""
    """What the run trains on, for the start-up lines (data.datasets.data_line)."""
    data_prefixes: Optional[dict] = None
    """The datasets it reads, recorded in each checkpoint (data.record.prefix_record)."""


def _with_vocab(cfg: Config, tokenizer) -> Config:
    if cfg.model.vocab_size is not None:  # check_data_config checks that the tokenizer fits
        return cfg
    return cfg.replace(model=dataclasses.replace(cfg.model, vocab_size=tokenizer.vocab_size))


def _check_start_point(cfg: Config, run_dir: Path, resolved) -> list[str]:
    """Before any process group starts or anything is written: the run's own checkpoint must mean what
    this config means (checkpoint/resume_rules.py; checkpoint.start_fresh moves it aside instead), and
    a checkpoint.load for a new run must name a complete checkpoint whose main model is this config's.
    Returns the notes of a load that leaves MTP modules out, or of other datasets accepted
    (data.allow_changed_paths)."""
    from megatron_mtp.data.record import refuse_changed_prefixes

    own = None if cfg.checkpoint.start_fresh else find_checkpoint(run_dir)
    if own is not None:
        refuse_meaning_changes(read_config(own.path), cfg, own.path, run_dir)
        refuse_tokenizer_change(own.path, resolved.tokenizer, run_dir)
        saved = read_train_state(own.path)
        changed = refuse_changed_prefixes(saved, resolved, cfg.data.allow_changed_paths, own.path, run_dir)
        reason = check_optimizer_compatible(saved, cfg.parallel.expert, optimizer_layout(cfg))
        if reason is not None:
            raise UserError(f"cannot resume {run_dir} from {own.path.name}: {reason}; or start a new run from its "
                            f"weights with --run-dir NEW checkpoint.load={own.path} checkpoint.load_optimizer=false")
        return [changed] if changed else []
    elif cfg.checkpoint.load:
        src = resolve_checkpoint(cfg.checkpoint.load, what="checkpoint.load")
        return refuse_load_changes(read_config(src.path), cfg, src.path, cfg.checkpoint.load_optimizer)
    return []


def open_training(cfg: Config, run_dir: Path) -> Session:
    from megatron_mtp.data.datasets import check_data_config, resolve_data
    from megatron_mtp.data.record import prefix_record
    from megatron_mtp.models.default_corpus_rule import default_corpus_refusal

    refusal = default_corpus_refusal(cfg)
    if refusal:  # the first thing a big recipe with its data forgotten hears (from the config alone: every rank)
        with same_on_every_rank():
            raise UserError(refusal)
    _, world = env_world()
    validate(cfg, world)
    check_credentials(cfg, run_dir)  # W&B online without a key: one sentence before the ranks meet
    megatron_core.transformer_config_extras(cfg.mtp)
    resolved = resolve_data(cfg)
    cfg = _with_vocab(cfg, resolved.tokenizer)
    data_line = check_data_config(cfg, resolved)
    load_notes = _check_start_point(cfg, run_dir, resolved)
    platform = setup_platform(cfg.training.device, cfg.parallel.backend, cfg.training.fp8)
    ranks = init_distributed(cfg, platform)
    before = run_dir_state(run_dir)
    lock, notes = claim_run_dir(run_dir, cfg.checkpoint.start_fresh, ranks)
    try:
        session = _open_claimed(cfg, run_dir, platform, ranks, resolved, lock, notes + load_notes)
        session.data_line = data_line
        session.data_prefixes = prefix_record(resolved)
        return session
    except BaseException:
        if lock is not None:  # nothing of this attempt stays to make the next one different
            lock.release()
            forget_claim(run_dir, before)
        raise


def _open_claimed(cfg: Config, run_dir: Path, platform: Platform, ranks: Ranks, resolved, lock,
                  notes: list[str]) -> Session:
    from megatron_mtp.data.datasets import build_datasets
    from megatron_mtp.data.passes import planned_train_samples

    components = build_components(cfg, platform, padded_vocab_size(cfg.model.vocab_size, cfg))

    state, loaded_from, weights_only = TrainState(), None, False
    own = find_checkpoint(run_dir)
    fully_parallel = cfg.checkpoint.fully_parallel_load
    if own is not None:
        own, state, damaged = _load_newest_readable(own, components, ranks, fully_parallel, optimizer_layout(cfg))
        loaded_from = own.path
        notes += [own.note] if own.note else []
        notes += damaged
        changed = schedule_changes(read_config(own.path), cfg)
        if changed:
            notes.append(f"the schedule differs from {own.path.name}'s ({'; '.join(changed)}); this config's "
                         f"schedule applies from step {state.step + 1}")
    elif cfg.checkpoint.load:
        src = resolve_checkpoint(cfg.checkpoint.load, what="checkpoint.load")
        # a frozen base trains an optimizer of the MTP parameters alone: never the source's (mtp.freeze_base)
        take_optimizer = cfg.checkpoint.load_optimizer and not cfg.mtp.freeze_base
        state = ckpt_io.load_checkpoint(src.path, components, ranks, load_optimizer=take_optimizer,
                                        fully_parallel=fully_parallel, cfg=cfg, layout=optimizer_layout(cfg))
        loaded_from, weights_only = src.path, not take_optimizer
        notes += [src.note] if src.note else []
    if loaded_from is not None:
        refuse_nonfinite_loaded_weights(components, loaded_from)
    for chunk in components.model:  # what a model draws from the weights it loaded (a new assistant's clusters)
        prepare = getattr(unwrap(chunk), "prepare_after_load", None)
        if prepare is not None:
            prepare()
    if weights_only and components.optimizer is not None:
        # the optimizer's own copies of the weights (fp32 main parameters beside bf16 ones) were made from the
        # initial weights when it was built: they take the loaded ones, or its first step would put those back
        components.optimizer.reload_model_params()

    t = cfg.training
    train_samples = planned_train_samples(cfg)  # read past it in reshuffled passes (data/passes.py)
    evals = (t.max_steps // cfg.logging.eval_interval + 1) if cfg.logging.eval_interval else 1
    valid_samples = evals * cfg.logging.eval_steps * t.global_batch_size
    train_ds, valid_ds = build_datasets(cfg, resolved, train_samples, valid_samples)
    return Session(cfg, platform, ranks, components, state, train_ds, valid_ds, resolved.tokenizer_path,
                   resolved.tokenizer, loaded_from, notes, lock)


def _load_newest_readable(own, components: Components, ranks: Ranks, fully_parallel: bool, layout: dict):
    """Resume from the run's newest checkpoint that reads back. One whose bytes are damaged (complete in
    name and size, unreadable or failing its digests) is moved to checkpoints.damaged/ and the next newest
    is tried, with a note each; with none left, the damage is one sentence (and the damaged checkpoint
    stays where it is). Returns (the checkpoint loaded, its state, the notes)."""
    import torch

    notes = []
    while True:
        try:
            state = ckpt_io.load_checkpoint(own.path, components, ranks, load_optimizer=True,
                                            fully_parallel=fully_parallel, layout=layout)
            return own, state, notes
        except ckpt_io.DamagedCheckpoint as exc:  # raised on every rank together (its docstring)
            fallback = None
            if ranks.rank == 0:
                fallback = set_aside_damaged(own.path)
            found = all_reduce_sum(torch.tensor([1.0 if fallback is not None or ranks.rank != 0 else 0.0]),
                                   op=torch.distributed.ReduceOp.MIN)  # through the device NCCL needs
            if not found[0]:
                with same_on_every_rank():
                    raise UserError(f"{exc.ckpt} is damaged ({exc.what}) and the run has no older complete "
                                    "checkpoint to resume from; restore it, or start over with "
                                    "checkpoint.start_fresh=true") from None
            nxt = find_checkpoint(own.path.parent.parent)
            notes.append(f"{own.path.name} is damaged ({exc.what}); it was moved to {DAMAGED_DIR}/ and the run "
                         f"resumes from {nxt.path.name}")
            own = nxt


def open_checkpoint_for_eval(ckpt: Path, cfg: Config) -> Session:
    """Model (no optimizer) loaded from `ckpt`, at the layout of the processes launched now."""
    from megatron_mtp.data.tokenizer import load_tokenizer

    _, world = env_world()
    validate(cfg, world)
    tok_dir = ckpt / TOKENIZER_DIR
    tokenizer = load_tokenizer(tok_dir) if tok_dir.exists() else None
    platform = setup_platform(cfg.training.device, cfg.parallel.backend, cfg.training.fp8)
    ranks = init_distributed(cfg, platform)
    components = build_components(cfg, platform, padded_vocab_size(cfg.model.vocab_size, cfg), with_optimizer=False)
    ckpt_io.load_checkpoint(ckpt, components, ranks, load_optimizer=False)
    refuse_nonfinite_loaded_weights(components, ckpt)
    return Session(cfg, platform, ranks, components, TrainState(), None, None,
                   str(tok_dir) if tokenizer else None, tokenizer, ckpt)
