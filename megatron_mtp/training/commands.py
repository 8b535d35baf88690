"""Entry points behind `megatron-mtp train` / `eval` (one process of a possibly larger job)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

from megatron_mtp import strict_json
from megatron_mtp.config import Config
from megatron_mtp.errors import EXIT_FINISHED, UserError


def _write_resolved_config(cfg: Config, run_dir: Path) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(cfg.to_yaml())
    os.replace(tmp, run_dir / "config.yaml")


def train_main(cfg: Config, run_dir: Path) -> int:
    from megatron_mtp.training.distributed import destroy
    from megatron_mtp.training.session import open_training
    from megatron_mtp.training.trainer import Trainer

    run_dir = run_dir.resolve()
    session = open_training(cfg, run_dir)
    try:
        ranks = session.ranks
        if ranks.rank == 0:
            _write_resolved_config(session.cfg, run_dir)
            restart = os.environ.get("SLURM_RESTART_COUNT")
            where = "from scratch"
            if session.loaded_from:
                where = f"resumed from {session.loaded_from} at step {session.state.step}"
            for note in session.notes:
                print(f"megatron-mtp train: note: {note}", flush=True)
            vpp = f" (VPP{ranks.vpp})" if ranks.vpp > 1 else ""
            experts = f"EP{ranks.ep}" + (f" × ETP{ranks.etp}" if ranks.etp != ranks.tp else "")
            context = f"CP{ranks.cp} × " if ranks.cp > 1 else ""
            print(f"megatron-mtp train: run {session.cfg.name} in {run_dir} on {session.platform.device}/"
                  f"{session.platform.backend}, world {ranks.world_size} = TP{ranks.tp} × PP{ranks.pp}{vpp} × "
                  f"{context}DP{ranks.dp} ({experts}), {where}"
                  + (f", SLURM_RESTART_COUNT={restart}" if restart else ""), flush=True)
            from megatron_mtp.plan.report import startup_line

            print(f"megatron-mtp train: {startup_line(session.cfg, ranks.world_size, session.platform)}", flush=True)
            if session.data_line:
                print(f"megatron-mtp train: {session.data_line}", flush=True)
            _note_if_not_exportable(session.cfg)
        code = Trainer(session, run_dir).train()
        if ranks.rank == 0 and code == EXIT_FINISHED:
            from megatron_mtp.training.run_summary import format_summary, summarize

            try:
                print(format_summary(summarize(run_dir)), flush=True)
            except UserError:  # nothing logged to sum up (no interval ended): the run itself is fine
                pass
        return code
    finally:
        if session.lock is not None:
            session.lock.release()
        destroy()


def _note_if_not_exportable(cfg: Config) -> None:
    """Say at the start, not after days of training, if `convert to-hf` will refuse this model."""
    from megatron_mtp.models.family import get_family

    family = get_family(cfg.model.family)
    try:
        family.to_hf_config(cfg.model, cfg.mtp, vocab_size=cfg.model.vocab_size or 1,
                            num_nextn_predict_layers=cfg.mtp.modules)
    except UserError as exc:
        print(f"megatron-mtp train: note: this model cannot be exported to the Hugging Face "
              f"{family.architecture} format as configured ({exc})", flush=True)


def _eval_config(ckpt: Path, overrides: list[str]) -> Config:
    from megatron_mtp.checkpoint.info import read_config
    from megatron_mtp.config.base import apply_override, from_dict
    from megatron_mtp.config.root import Config as RootConfig
    from megatron_mtp.training.distributed import env_world

    cfg = read_config(ckpt)
    data = cfg.to_dict()
    _, world = env_world()
    # evaluate at the layout of the processes launched now (default: one process)
    data["parallel"].update(tensor=1, pipeline=1, expert=1, world_size=None, pipeline_layout=None,
                            sequence_parallel=None)
    data["checkpoint"]["load"] = str(ckpt)  # the model evaluated (a frozen-base config needs the one it loads)
    for o in overrides:
        apply_override(data, RootConfig, o)
    cfg = from_dict(RootConfig, data)
    dp = world // (cfg.parallel.tensor * cfg.parallel.pipeline)
    data["training"]["global_batch_size"] = cfg.training.micro_batch_size * max(dp, 1)
    return from_dict(RootConfig, data)


@dataclasses.dataclass(frozen=True)
class EvalData:
    """The one token stream and batch shape every side of an evaluation is scored on (the first
    checkpoint's shape): a text (--text-file, or the default corpus's held-out files for a checkpoint
    with a tokenizer of its own and no datasets, e.g. an imported model), else the first checkpoint's
    validation data."""

    seq_length: int
    micro_batch_size: int
    data: Any
    """The first checkpoint's data config (validation datasets), used when ``text`` is None."""
    text: Optional[str] = None
    where: str = ""
    max_windows: Optional[int] = None


def _eval_data(first: Config, text_file: Optional[str], steps: Optional[int]) -> EvalData:
    from megatron_mtp.training.text_eval import read_text_file

    t = first.training
    shape = {"seq_length": t.seq_length, "micro_batch_size": t.micro_batch_size, "data": first.data}
    if text_file:
        return EvalData(**shape, text=read_text_file(text_file), where=f"--text-file {text_file}")
    if first.data.paths is None and first.data.tokenizer is not None:
        from megatron_mtp.data.default_corpus import validation_text

        return EvalData(**shape, text=validation_text(first.data.default_corpus_max_bytes),
                        where="the default corpus's held-out files",
                        max_windows=(steps or first.logging.eval_steps) * t.global_batch_size)
    d = first.data
    where = ("the validation data of data.valid_paths" if d.valid_paths else "the validation split of data.paths"
             if d.paths else "the validation split of the embedded default corpus (data.paths is null)")
    return EvalData(**shape, where=where)


def _compare_note(second: Path, cfg: Config, data: EvalData, text_file: Optional[str], steps: Optional[int]):
    """Why --compare scores its checkpoint on other tokens than `eval` of it alone would (None: the same)."""
    alone = _eval_data(cfg, text_file, steps)
    if (alone.where, alone.seq_length, alone.max_windows) == (data.where, data.seq_length, data.max_windows) \
            and (data.text is not None or alone.data == data.data):
        return None
    own = alone.where + (" of its own data config" if alone.where == data.where else "")
    return (f"--compare scores both checkpoints on the first one's tokens, {data.where} in windows of "
            f"{data.seq_length}, while {second} alone is scored on {own} in windows of {alone.seq_length}, so its "
            "numbers here differ from its eval alone; give it first to score both on its tokens")


def _side_config(cfg: Config, data: EvalData) -> Config:
    """A side's config (``_eval_config``), scored at the shared batch shape (and on the shared datasets)."""
    t = cfg.training
    dp = max(t.global_batch_size // t.micro_batch_size, 1)
    training = dataclasses.replace(t, seq_length=data.seq_length, micro_batch_size=data.micro_batch_size,
                                   global_batch_size=data.micro_batch_size * dp)
    if data.text is not None:
        return cfg.replace(training=training)
    return cfg.replace(training=training, data=data.data)


def _evaluate_checkpoint(ckpt: Path, cfg: Config, data: EvalData, steps: Optional[int]) -> dict:
    """One checkpoint's evaluation (megatron-core's parallel state is torn down after it; the world
    process group stays for the next)."""
    from megatron.core import parallel_state

    from megatron_mtp.training.evaluation import evaluate, evaluate_batches, session_metrics
    from megatron_mtp.training.session import open_checkpoint_for_eval

    session = open_checkpoint_for_eval(ckpt, cfg)
    try:
        metrics = session_metrics(session)
        if data.text is not None:
            from megatron_mtp.training.text_eval import text_batches

            batches, num_micro, windows = text_batches(session, data.text, data.where, data.max_windows)
            result = evaluate_batches(session, batches, num_micro, metrics, cfg.training.micro_batch_size,
                                      cfg.training.seq_length)
            s = cfg.training.seq_length
            result["data"] = (f"{data.where}: {windows} windows of training.seq_length={s} tokens, {s - 1} predictions "
                              "each (a window's last token has no next one)"
                              + (f"; at most logging.eval_steps × training.global_batch_size = {data.max_windows} "
                                 "windows" if data.max_windows is not None else ""))
        else:
            from megatron_mtp.data.datasets import build_datasets, resolve_data

            n = steps or cfg.logging.eval_steps
            resolved_data = resolve_data(cfg)
            _, session.valid_dataset = build_datasets(cfg, resolved_data, cfg.training.global_batch_size,
                                                      n * cfg.training.global_batch_size)
            if session.valid_dataset is None:
                raise UserError("the checkpoint's data config has no validation split; pass --text-file or set "
                                "data.split/data.valid_paths")
            result = evaluate(session, n, metrics)
            t = cfg.training
            result["data"] = (f"{data.where}: {n} batches of {t.global_batch_size} sequences of "
                              f"training.seq_length={t.seq_length} tokens, each token's next one scored")
        result["checkpoint"] = str(ckpt)
        return result
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()


def eval_main(path: str, overrides: list[str], as_json: bool, text_file: str | None, steps: int | None,
              compare: str | None = None) -> int:
    """Evaluate a checkpoint; with `compare`, another one on the same tokens at the same batch shape,
    side by side (e.g. an MTP-only run and the model it started from: the acceptance per depth before
    and after)."""
    import torch

    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.training.distributed import destroy

    try:
        resolved = [resolve_checkpoint(p) for p in [path] + ([compare] if compare else [])]  # all exist first
        for r in resolved:
            if r.note:
                print(f"megatron-mtp eval: note: {r.note}", file=sys.stderr)
        configs = [_eval_config(r.path, overrides) for r in resolved]
        data = _eval_data(configs[0], text_file, steps)
        sides = [_side_config(cfg, data) for cfg in configs]
        vocabs = {c.model.vocab_size for c in sides}
        if len(vocabs) > 1:
            raise UserError(f"--compare needs two models of one vocabulary, and {resolved[0].path} has "
                            f"{sides[0].model.vocab_size} tokens where {resolved[1].path} has "
                            f"{sides[1].model.vocab_size}; compare checkpoints of the same tokenizer")
        if data.text is not None and len(resolved) == 2:
            _refuse_two_tokenizers(resolved[0].path, resolved[1].path, data.where)
        note = _compare_note(resolved[1].path, configs[1], data, text_file, steps) if compare else None
        if note:
            print(f"megatron-mtp eval: note: {note}", file=sys.stderr)
        results = [_evaluate_checkpoint(r.path, cfg, data, steps) for r, cfg in zip(resolved, sides)]
        if torch.distributed.get_rank() == 0:
            if as_json:
                print(strict_json.dumps(results[0] if not compare else {"checkpoints": results}))
            elif not compare:
                result, ckpt = results[0], results[0]["checkpoint"]
                print(f"checkpoint {ckpt}")
                print(f"tokens evaluated  {result['tokens']} ({result['data']})")
                ppl = math.exp(min(result["lm_loss"], 50))
                print(f"lm_loss           {result['lm_loss']:.6f} (perplexity {ppl:.3f})")
                for k, (loss, acc) in enumerate(zip(result["mtp_loss"], result["mtp_acceptance"]), start=1):
                    print(f"mtp depth {k}       loss {loss:.6f}  acceptance {acc:.4f}")
            else:
                print(_side_by_side(results))
        sys.stdout.flush()
        return 0
    finally:
        destroy()


def _json(path: Path) -> Any:
    import json

    return json.loads(path.read_text(encoding="utf-8"))


def _refuse_two_tokenizers(first: Path, second: Path, where: str) -> None:
    """A text is one token stream for both sides only through one tokenizer."""
    from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR

    files = [ckpt / TOKENIZER_DIR / "tokenizer.json" for ckpt in (first, second)]
    if all(f.is_file() for f in files) and _json(files[0]) != _json(files[1]):
        raise UserError(f"--compare scores {where} through each checkpoint's tokenizer, and {first} and {second} "
                        "have different ones, so the two sides would see different tokens; compare checkpoints of "
                        "one tokenizer")


def _side_by_side(results: list[dict]) -> str:
    """Two evaluations as one table: LM loss, then MTP loss and teacher-forced acceptance per depth
    ('-' where a checkpoint has no MTP module at that depth)."""
    depth = max(len(r["mtp_loss"]) for r in results)
    lines = [f"scored on {results[0]['data']}",
             f"{'':18}" + "".join(f"  {name:>22}" for name in ("checkpoint", "--compare")),
             *(f"{'':18}  {r['checkpoint']}" for r in results),
             f"{'tokens evaluated':18}" + "".join(f"  {r['tokens']:>22}" for r in results),
             f"{'lm_loss':18}" + "".join(f"  {r['lm_loss']:>22.6f}" for r in results)]
    for k in range(depth):
        for key, label, fmt in (("mtp_loss", "loss", ".6f"), ("mtp_acceptance", "acceptance", ".4f")):
            cells = [format(r[key][k], fmt) if k < len(r[key]) else "-" for r in results]
            lines.append(f"{f'mtp {k + 1} {label}':18}" + "".join(f"  {c:>22}" for c in cells))
    return "\n".join(lines)
