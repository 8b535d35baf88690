"""Entry points behind `megatron-mtp train` / `eval` (one process of a possibly larger job)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

from megatron_mtp import strict_json
from megatron_mtp.config import Config
from megatron_mtp.errors import UserError


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
            print(f"megatron-mtp train: run {session.cfg.name} in {run_dir} on {session.platform.device}/"
                  f"{session.platform.backend}, world {ranks.world_size} = TP{ranks.tp} × PP{ranks.pp}{vpp} × "
                  f"DP{ranks.dp} ({experts}), {where}" + (f", SLURM_RESTART_COUNT={restart}" if restart else ""),
                  flush=True)
            from megatron_mtp.plan.report import startup_line

            print(f"megatron-mtp train: {startup_line(session.cfg, ranks.world_size, session.platform)}", flush=True)
            _note_if_not_exportable(session.cfg)
        return Trainer(session, run_dir).train()
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
              f"{family.HF_ARCHITECTURES[0]} format as configured ({exc})", flush=True)


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
    for o in overrides:
        apply_override(data, RootConfig, o)
    cfg = from_dict(RootConfig, data)
    dp = world // (cfg.parallel.tensor * cfg.parallel.pipeline)
    data["training"]["global_batch_size"] = cfg.training.micro_batch_size * max(dp, 1)
    return from_dict(RootConfig, data)


def _evaluate_checkpoint(path: str, overrides: list[str], text_file: str | None, steps: int | None) -> dict:
    """One checkpoint's evaluation (megatron-core's parallel state is torn down after it; the world
    process group stays for the next)."""
    from megatron.core import parallel_state

    from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
    from megatron_mtp.training.evaluation import evaluate, evaluate_batches, session_metrics
    from megatron_mtp.training.session import open_checkpoint_for_eval

    resolved = resolve_checkpoint(path)
    if resolved.note:
        print(f"megatron-mtp eval: note: {resolved.note}", file=sys.stderr)
    ckpt = resolved.path
    cfg = _eval_config(ckpt, overrides)
    session = open_checkpoint_for_eval(ckpt, cfg)
    try:
        metrics = session_metrics(session)
        if text_file:
            from megatron_mtp.training.text_eval import text_file_batches

            batches, num_micro = text_file_batches(session, text_file)
            result = evaluate_batches(session, batches, num_micro, metrics, cfg.training.micro_batch_size,
                                      cfg.training.seq_length)
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
        result["checkpoint"] = str(ckpt)
        return result
    finally:
        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()


def eval_main(path: str, overrides: list[str], as_json: bool, text_file: str | None, steps: int | None,
              compare: str | None = None) -> int:
    """Evaluate a checkpoint; with `compare`, another one on the same tokens, side by side (e.g. an
    MTP-only run and the model it started from: the acceptance per depth before and after)."""
    import torch

    from megatron_mtp.training.distributed import destroy

    try:
        paths = [path] + ([compare] if compare else [])
        if compare:  # both named checkpoints exist, before the first is evaluated
            from megatron_mtp.checkpoint.run_dir import resolve_checkpoint

            for p in paths:
                resolve_checkpoint(p)
        results = [_evaluate_checkpoint(p, overrides, text_file, steps) for p in paths]
        if torch.distributed.get_rank() == 0:
            if as_json:
                print(strict_json.dumps(results[0] if not compare else {"checkpoints": results}))
            elif not compare:
                result, ckpt = results[0], results[0]["checkpoint"]
                print(f"checkpoint {ckpt}")
                print(f"tokens evaluated  {result['tokens']}")
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


def _side_by_side(results: list[dict]) -> str:
    """Two evaluations as one table: LM loss, then MTP loss and teacher-forced acceptance per depth
    ('-' where a checkpoint has no MTP module at that depth)."""
    depth = max(len(r["mtp_loss"]) for r in results)
    lines = [f"{'':18}" + "".join(f"  {name:>22}" for name in ("checkpoint", "--compare")),
             *(f"{'':18}  {r['checkpoint']}" for r in results),
             f"{'tokens evaluated':18}" + "".join(f"  {r['tokens']:>22}" for r in results),
             f"{'lm_loss':18}" + "".join(f"  {r['lm_loss']:>22.6f}" for r in results)]
    for k in range(depth):
        for key, label, fmt in (("mtp_loss", "loss", ".6f"), ("mtp_acceptance", "acceptance", ".4f")):
            cells = [format(r[key][k], fmt) if k < len(r[key]) else "-" for r in results]
            lines.append(f"{f'mtp {k + 1} {label}':18}" + "".join(f"  {c:>22}" for c in cells))
    return "\n".join(lines)
