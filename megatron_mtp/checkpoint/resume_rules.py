"""Which config fields a resume may change, and the refusal when one that may not has changed.

Design note. A checkpoint's tensors and token ids mean something only under the config that wrote
them: the model's shape and MoE layout, the MTP depth and style, the vocabulary and the tokenizer.
Resuming a run directory with any of those changed either ends deep inside megatron-core (a missing
key, a global shape mismatch) or, worse, trains on (a new tokenizer maps the same ids to other
text) and lets `keep_last` delete the good checkpoints. So before any process group starts, the
trainer compares these fields with the checkpoint's recorded config, and the data's tokenizer with
the one saved in the checkpoint (by fingerprint: two tokenizers of one vocabulary size pass every
other check), and refuses the resume in one sentence. Everything else may change on resume: the
parallel layout (checkpoints reshard), the schedule and learning rate (the config's wins:
training/schedules.py), intervals, recompute and the other memory and speed controls, the loss
weights, the data blend, the router's bias update rate and the aux-loss coefficient. mtp.freeze_base
may not change either: the optimizer state holds the MTP parameters alone, or every parameter.

A new run that starts from another run's weights (checkpoint.load) follows the same rule for the
main model: every field of MEANING outside mtp.* must be the checkpoint's, since a weights-only load
of another vocabulary zero-pads the embedding, of fewer layers drops some, and of another width ends
in megatron-core's shape mismatch. Only the MTP modules may differ, because that is what MTP-only
training exists for: a run may add sequential modules (mtp.init draws or copies them) or load fewer
than the checkpoint holds (each left out is named in a note); it may not turn modules into parallel
heads or change their number of heads (a load initialises no head), and new modules need
checkpoint.load_optimizer=false (the optimizer state belongs to other parameters). mtp.repeated_layer
may differ: its one module is module 0 of the checkpoint. The family may differ where the run's grows from
the checkpoint's (``ModelConfig.grows_from``: DeepSeek-V3.2 from DeepSeek-V3, its indexers new): the fields
both families have must be the checkpoint's, and the optimizer is not loaded. A family's TRAINING_FIELDS
(loss weights, a training stage) may change on a resume and a load, but those that pick which parameters
train (TRAINED_PART_FIELDS) only on a load.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from megatron_mtp.config import Config
from megatron_mtp.config.model import ModelConfig
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.config.vocab import padded_vocab_size
from megatron_mtp.errors import UserError

MEANING = (
    # the shapes of the tensors and what the layers compute
    "model.family", "model.num_layers", "model.hidden_size", "model.ffn_hidden_size", "model.num_attention_heads",
    "model.rope_theta", "model.norm_epsilon", "model.tie_embeddings",
    # (and every field of the family's own: family_fields)
    # the MoE layout and routing
    "model.num_experts", "model.first_k_dense", "model.moe_ffn_hidden_size", "model.num_shared_experts",
    "model.router_topk", "model.router_num_groups", "model.router_group_topk", "model.router_score_function",
    "model.router_topk_scaling_factor", "model.router_norm_topk_prob", "model.router_enable_expert_bias",
    # the MTP modules
    "mtp.num_layers", "mtp.style", "mtp.repeated_layer",
    # what token ids mean
    "model.vocab_size", "data.tokenizer", "data.default_corpus_vocab_size",
)
"""Config fields whose change makes a checkpoint mean something else (docs: README.md, "Checkpoints and resume"),
besides the family's own fields (its attention's shapes and rotary settings: ``family_fields``)."""


def family_fields(cfg: Config) -> tuple[str, ...]:
    """``model.<field>`` for each field the run's family adds to the shared ModelConfig (they shape the
    attention or its rotary embedding: models/<family>/model_config.py), but its TRAINING_FIELDS."""
    shared = {f.name for f in dataclasses.fields(ModelConfig)} | set(type(cfg.model).TRAINING_FIELDS)
    return tuple(f"model.{f.name}" for f in dataclasses.fields(cfg.model) if f.name not in shared)


def _field(cfg: Config, dotted: str) -> Any:
    value: Any = cfg
    for part in dotted.split("."):
        value = getattr(value, part)
    return value.__dict__ if hasattr(value, "__dataclass_fields__") else value


LOAD_MEANING = tuple(name for name in MEANING if not name.startswith(("mtp.", "data.")))
"""What a weights-only checkpoint.load keeps of MEANING: the MTP modules follow their own rules
(refuse_load_changes) and the data may change (the vocabulary's size still may not)."""


def meaning_changes(saved: Config, now: Config, fields: tuple[str, ...] = MEANING, grow: bool = False) -> list[str]:
    """'FIELD is A in the checkpoint and B now' for each field of MEANING that differs, and the padded
    vocabulary when only the padding rule changed it; ``grow``: the model may be of a family that grows from
    the checkpoint's (ModelConfig.grows_from)."""
    grown = grow and saved.model.family != now.model.family and now.model.grows_from(saved.model.family) is not None
    if "model.family" in fields and saved.model.family != now.model.family and not grown:
        return [f"model.family is {saved.model.family!r} in the checkpoint and {now.model.family!r} now"]
    if grown:  # the fields both families have (the new one's own shape only what is new: Growth.fresh)
        fields = (*(f for f in fields if f != "model.family"), *family_fields(saved))
    elif "model.family" in fields:
        fields = (*fields, *family_fields(now))
    changes = [f"{name} is {_field(saved, name)!r} in the checkpoint and {_field(now, name)!r} now"
               for name in fields if _field(saved, name) != _field(now, name)]
    if not changes and saved.model.vocab_size is not None and now.model.vocab_size is not None:
        before, after = padded_vocab_size(saved.model.vocab_size, saved), padded_vocab_size(now.model.vocab_size, now)
        if before != after:
            changes.append(f"the padded vocabulary is {before} in the checkpoint and {after} now "
                           "(model.make_vocab_size_divisible_by or the tensor-parallel size)")
    return changes


def refuse_meaning_changes(saved: Config, now: Config, step_dir: Path, run_dir: Path) -> None:
    """One sentence naming every changed field with both values, and the two ways out."""
    if saved.mtp.freeze_base != now.mtp.freeze_base:  # the optimizer state covers other parameters
        raise UserError(f"cannot resume {run_dir} from {step_dir.name}: mtp.freeze_base is {saved.mtp.freeze_base} "
                        f"in the checkpoint and {now.mtp.freeze_base} now, and its optimizer state holds "
                        f"{'the MTP parameters alone' if saved.mtp.freeze_base else 'every parameter'}; keep it to "
                        f"resume, or start a new run from these weights with --run-dir NEW "
                        f"checkpoint.load={step_dir} checkpoint.load_optimizer=false")
    same_family = saved.model.family == now.model.family
    for name in type(now.model).TRAINED_PART_FIELDS if same_family else ():  # what the optimizer state holds
        before, after = getattr(saved.model, name, None), getattr(now.model, name, None)
        if before != after:
            raise UserError(f"cannot resume {run_dir} from {step_dir.name}: model.{name} is {before} in the "
                            f"checkpoint and {after} now, which trains other parameters than its optimizer state "
                            f"holds; keep it to resume, or start a new run from these weights with --run-dir NEW "
                            f"checkpoint.load={step_dir} checkpoint.load_optimizer=false")
    changes = meaning_changes(saved, now)
    if changes:
        raise UserError(f"cannot resume {run_dir} from {step_dir.name}: {'; '.join(changes)}, which changes what "
                        f"the checkpoint's weights or token ids mean; keep those values to resume, or train the "
                        f"new config elsewhere with --run-dir, or start a new run from these weights with "
                        f"--run-dir NEW checkpoint.load={step_dir} checkpoint.load_optimizer=false")


def refuse_tokenizer_change(step_dir: Path, tokenizer, run_dir: Path) -> None:
    """The tokenizer this run reads its data with must be the one the checkpoint was trained with: two
    tokenizers of one vocabulary size pass every shape check and map the same ids to other text."""
    from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR
    from megatron_mtp.data.tokenizer import load_tokenizer

    saved_dir = step_dir / TOKENIZER_DIR
    if tokenizer is None or not (saved_dir / "tokenizer.json").is_file():
        return
    saved = load_tokenizer(saved_dir)
    if saved.fingerprint() != tokenizer.fingerprint():
        raise UserError(f"cannot resume {run_dir} from {step_dir.name}: the data's tokenizer ({tokenizer.source}, "
                        f"fingerprint {tokenizer.fingerprint()}) is not the one the checkpoint was trained with "
                        f"(fingerprint {saved.fingerprint()}, saved in {saved_dir}), so the same token ids would "
                        "mean other text; use data preprocessed with the checkpoint's tokenizer, or start a new "
                        f"run from these weights with --run-dir NEW checkpoint.load={step_dir} "
                        "checkpoint.load_optimizer=false")


def _mtp_words(mtp) -> str:
    if not mtp.num_layers:
        return "no MTP"
    return get_style(mtp.style).words(mtp)


def mtp_parts(mtp) -> list[str]:
    """The checkpoint-key prefixes of a run's MTP parts, one per module or head (one for an assistant): what a
    weights-only load draws anew where the checkpoint lacks them, or leaves out where the run lacks them."""
    if not mtp.num_layers:
        return []
    return get_style(mtp.style).parts(mtp)


def refuse_load_changes(saved: Config, now: Config, src: Path, load_optimizer: bool) -> list[str]:
    """checkpoint.load of ``src`` into a new run (design note above): one sentence naming every main-model
    field that differs, or the MTP change a load cannot make; otherwise the notes to print."""
    where = f"cannot start this run from checkpoint.load={src}"
    changes = meaning_changes(saved, now, LOAD_MEANING, grow=True)
    if changes:
        raise UserError(f"{where}: {'; '.join(changes)}, which changes what the checkpoint's weights or token ids "
                        f"mean (a weights-only load may change only the MTP modules); keep the checkpoint's values "
                        f"(its config.yaml), or train this config from scratch without checkpoint.load")
    if saved.model.family != now.model.family and load_optimizer:
        raise UserError(f"{where}: the checkpoint is a {saved.model.family} model and this run's model.family "
                        f"{now.model.family} adds tensors its optimizer state has none for; set "
                        "checkpoint.load_optimizer=false")
    before, after = saved.mtp, now.mtp
    new = [p for p in mtp_parts(after) if p not in mtp_parts(before)]
    if new and load_optimizer and not after.freeze_base:
        raise UserError(f"{where}: this run adds MTP parts (the checkpoint has {_mtp_words(before)}, this run "
                        f"{_mtp_words(after)}) and checkpoint.load_optimizer=true would load an optimizer state "
                        "that has none for them; set checkpoint.load_optimizer=false")
    notes = []
    if saved.model.family != now.model.family:
        notes.append(f"checkpoint.load: {src} is a {saved.model.family} model; this {now.model.family} model takes "
                     "every tensor of it and draws the ones its family adds anew")
    left = [p.rstrip(".") for p in mtp_parts(before) if p not in mtp_parts(after)]
    if left:
        return notes + [f"checkpoint.load: {src} has {_mtp_words(before)}; this run loads {_mtp_words(after)} and "
                f"leaves out {', '.join(left)}"]
    return notes
