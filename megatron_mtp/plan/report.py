"""The plan as one JSON-ready dict (`--json`) and the table printed from that same dict."""

from __future__ import annotations

import glob
import json
import os
from typing import Optional

from megatron_mtp.config import pipeline_layout
from megatron_mtp.config.vocab import resolve_vocab
from megatron_mtp.models.default_corpus_rule import default_corpus_refusal
from megatron_mtp.models.family import get_family
from megatron_mtp.models.throughput import model_flops_per_token, peak_tflops
from megatron_mtp.plan import comm, schedule
from megatron_mtp.plan.memory import Plan, suggestions
from megatron_mtp.platform.gpus import GIB


def _chunks(plan: Plan, pp_rank: int) -> str:
    p = plan.cfg.parallel
    stages = pipeline_layout.stages(plan.cfg.model.num_layers, plan.cfg.mtp.num_layers, p.pipeline,
                                    p.virtual_pipeline, p.pipeline_layout)
    return "|".join(("E" if s.embedding else "") + "t" * len(s.layers) + "m" * s.mtp_layers + ("L" if s.loss else "")
                    for s in stages if s.pp_rank == pp_rank)


def _corpus_tokens(plan: Plan) -> tuple[Optional[int], Optional[str]]:
    """Tokens in data.paths (from the .bin sizes: uint16 ids below 65,500 vocabulary entries, else int32)."""
    paths = plan.cfg.data.paths
    if not paths:
        refusal = default_corpus_refusal(plan.cfg)
        if refusal:
            return None, f"{refusal} (train and submit refuse it)"
        return None, "data.paths is null (the embedded default corpus), so epochs over the training data are not " \
                     "estimated"
    width = 2 if resolve_vocab(plan.cfg) < 65500 else 4
    if any(p.startswith("@") for p in paths):
        return None, "data.paths names @list files, so epochs over the training data are not estimated"
    files = [f for prefix in paths for f in (sorted(glob.glob(f"{prefix}.bin")) if glob.has_magic(prefix)
                                              else [f"{prefix}.bin"])]
    try:
        return sum(os.path.getsize(f) for f in files) // width, None
    except OSError:
        return None, "the .bin files of data.paths are not readable here, so epochs are not estimated"


def build(plan: Plan, mfu: Optional[float] = None, with_suggestions: bool = True) -> dict:
    cfg, s, t = plan.cfg, plan.sizes, plan.cfg.training
    ranks = []
    for r in plan.ranks:
        st = r.state
        ranks.append({
            "pp_rank": r.pp_rank, "chunks": _chunks(plan, r.pp_rank),
            "params_bytes": st.params, "grads_bytes": st.grads, "optimizer_bytes": st.optimizer,
            "optimizer_host_bytes": st.optimizer_host, "fp8_cache_bytes": st.fp8_caches,
            "activation_bytes": r.activations, "pipeline_output_bytes": r.pipeline_outputs,
            "workspace_bytes": r.workspace, "total_bytes": r.total,
            "save_host_bytes": dict(r.save_host),
            "in_flight": r.in_flight, "in_flight_per_chunk": list(r.per_chunk),
            "activation_bytes_per_micro_batch": list(r.chunk_bytes),
            "comm_bytes_per_step": dict(sorted(comm.step_bytes(cfg, plan, r.pp_rank).items())),
        })
    worst = plan.worst
    tokens = t.global_batch_size * t.seq_length
    flops = model_flops_per_token(cfg, resolve_vocab(cfg)) * tokens
    out = {
        "config": cfg.name,
        "target": "cpu" if plan.target.platform.is_cpu else "gpu",
        "gpu": {"name": plan.gpu.name, "memory_bytes": plan.gpu.memory_bytes},
        "world": s.world,
        "layout": {"tp": s.tp, "pp": s.pp, "vpp": s.vpp, "cp": s.cp, "dp": s.dp, "ep": s.ep, "etp": s.etp,
                   "edp": s.edp},
        "micro_batches_per_step": plan.num_micro,
        "tokens_per_step": tokens,
        "training_flops_per_step": flops,
        "bubble_fraction": schedule.bubble_fraction(s.pp, s.vpp, plan.num_micro),
        "routing_imbalance": plan.imbalance,
        "optimizer_format": cfg.checkpoint.optimizer_format,
        "ranks": ranks,
        "worst": {"pp_rank": worst.pp_rank, "total_bytes": worst.total, "fits": plan.fits},
        "time": None,
        "notes": [],
        "suggestions": [],
        "assumptions": list(plan.assumptions),
    }
    costs = get_family(cfg.model.family).attention_costs
    if costs is not None:  # a sparse attention's FLOPs beside dense attention's (models/dsa/size.py)
        out["attention"] = {**costs(cfg), "model_flops_per_token": flops / tokens}
    corpus, note = _corpus_tokens(plan)
    if note:
        out["notes"].append(note)
    if mfu is not None:
        peak = peak_tflops(plan.gpu, cfg)
        if peak:
            step = flops / (s.world * peak * 1e12 * mfu)
            out["time"] = {"mfu": mfu, "peak": "fp8" if t.fp8 else "bf16", "peak_tflops_per_gpu": peak,
                           "bf16_peak_tflops_per_gpu": plan.gpu.bf16_tflops, "step_seconds": step,
                           "tokens_per_second": tokens / step, "run_seconds": step * t.max_steps,
                           "epochs": t.max_steps * tokens / corpus if corpus else None}
            out["assumptions"].append(f"time: {mfu:.0%} of the {'FP8' if t.fp8 else 'bf16'} dense peak "
                                      f"({peak:g} TFLOP/s per GPU) on the model's training FLOPs (3 × forward; the "
                                      "definition the trainer logs MFU with: models/throughput.py)")
        else:
            out["notes"].append(f"{plan.gpu.name} has no known peak FLOP/s, so --mfu gives no time estimate")
    if with_suggestions and not plan.fits:
        out["suggestions"] = [{"overrides": o, "worst_total_bytes": b} for o, b in suggestions(plan, s.world)]
    return out


def to_json(report: dict) -> str:
    return json.dumps(report, allow_nan=False, indent=1)


def _gib(n: float) -> str:
    return f"{n / GIB:6.1f}"


def format_table(report: dict) -> str:
    lay = report["layout"]
    gpu = report["gpu"]
    cpu = report["target"] == "cpu"
    vpp = f" (VPP{lay['vpp']})" if lay["vpp"] > 1 else ""
    head = f"plan for {report['config']} on {report['world']} " + (
        "CPU processes (gloo)" if cpu else f"× {gpu['name']} ({gpu['memory_bytes'] / GIB:.1f} GiB)")
    lines = [
        head,
        f"layout    TP{lay['tp']} × PP{lay['pp']}{vpp}" + (f" × CP{lay['cp']}" if lay["cp"] > 1 else "") +
        f" × DP{lay['dp']}; experts EP{lay['ep']} × ETP{lay['etp']} × "
        f"EDP{lay['edp']}; {report['micro_batches_per_step']} micro-batches per step, "
        f"{report['tokens_per_step']:,} tokens per step",
        f"schedule  pipeline bubble {report['bubble_fraction']:.1%} of a step ((p - 1) / (v m + p - 1))",
        "",
        "memory per pipeline rank, GiB (worst data-parallel rank)",
    ]
    kept = any(r["pipeline_output_bytes"] for r in report["ranks"])  # chunk outputs are kept on CPU only
    lines.append("  pp chunks              params  grads  optim    fp8  activ" + ("  p2p-out" if kept else "") +
                 "  work   total  in-flight")
    for r in report["ranks"]:
        chunks = r["chunks"] if len(r["chunks"]) <= 18 else r["chunks"][:15] + "..."
        p2p = f"  {_gib(r['pipeline_output_bytes'])}" if kept else ""
        lines.append(f"  {r['pp_rank']:2d} {chunks:18s} {_gib(r['params_bytes'])} {_gib(r['grads_bytes'])}"
                     f"{_gib(r['optimizer_bytes'])} {_gib(r['fp8_cache_bytes'])} {_gib(r['activation_bytes'])}"
                     f"{p2p} {_gib(r['workspace_bytes'])} {_gib(r['total_bytes'])}"
                     f"  {r['in_flight']:4d} {tuple(r['in_flight_per_chunk'])}")
        if r["optimizer_host_bytes"]:
            lines.append(f"     + {r['optimizer_host_bytes'] / GIB:.1f} GiB optimizer state in host memory")
    w = report["worst"]
    if cpu:
        lines.append(f"worst rank: pipeline rank {w['pp_rank']}, {w['total_bytes'] / GIB:.2f} GiB")
    else:
        share = w["total_bytes"] / gpu["memory_bytes"]
        verdict = "fits" if w["fits"] else "DOES NOT FIT"
        lines.append(f"worst rank: pipeline rank {w['pp_rank']}, {w['total_bytes'] / GIB:.1f} GiB of "
                     f"{gpu['memory_bytes'] / GIB:.1f} GiB ({share:.0%}): {verdict}")
    fmt = report["optimizer_format"]
    save = max(report["ranks"], key=lambda r: r["save_host_bytes"]["reshardable"])["save_host_bytes"]
    lines.append(f"checkpoint save, host memory of the worst rank: {save['parallel'] / GIB:.1f} GiB in the parallel "
                 f"optimizer format, {save['reshardable'] / GIB:.1f} GiB in the reshardable one (this run: "
                 f"checkpoint.optimizer_format={fmt})")
    lines += ["", "communication per rank per step, GiB (whole tensors handed to the collectives)"]
    kinds = sorted({k for r in report["ranks"] for k in r["comm_bytes_per_step"]})
    if kinds:
        lines.append("rank" + "".join(f"{k:>10s}" for k in kinds))
        for r in report["ranks"]:
            lines.append(f"  {r['pp_rank']:2d} " + "".join(f"{r['comm_bytes_per_step'].get(k, 0) / GIB:10.2f}"
                                                             for k in kinds))
    else:
        lines.append("  none (a single process)")
    if report.get("attention"):
        lines += ["", attention_line(report["attention"])]
    time = report["time"]
    if time:
        epochs = f", {time['epochs']:.2f} epochs" if time["epochs"] else ""
        peak = time["peak_tflops_per_gpu"]
        against = f"{time['mfu']:.0%} MFU of the {time['peak'].upper()} dense peak ({peak:g} TFLOP/s"
        if time["peak"] == "fp8":  # an MFU quoted against bf16 is twice the share of the FP8 peak
            against += f"; {time['mfu'] * peak / time['bf16_peak_tflops_per_gpu']:.0%} of the bf16 peak"
        against += ")"
        lines += ["", f"time      {time['step_seconds']:.2f} s per step at {against}, "
                      f"{time['tokens_per_second']:,.0f} tokens/s, {time['run_seconds'] / 86400:.1f} days for "
                      f"training.max_steps{epochs}"]
    if report["suggestions"]:
        lines += ["", "to fit, try (in this order; predicted worst rank):"]
        lines += [f"  {s['overrides']}   -> {s['worst_total_bytes'] / GIB:.1f} GiB" for s in report["suggestions"]]
    if report["notes"]:
        lines += [""] + [f"note: {n}" for n in report["notes"]]
    lines += ["", "assumptions:"] + [f"  - {a}" for a in report["assumptions"]]
    return "\n".join(lines)


def attention_line(a: dict) -> str:
    """DSA's attention FLOPs per token beside dense MLA's (the report's ``attention``)."""
    g, unit = (1e9, "GFLOP") if a["model_flops_per_token"] >= 1e9 else (1e6, "MFLOP")
    dsa = a["indexer_flops_per_token"] + a["sparse_mla_flops_per_token"]
    return (f"attention (training FLOPs per token at {a['seq_length']:,} tokens, {a['layers']} layers): DSA "
            f"{dsa / g:,.1f} {unit} = indexer {a['indexer_flops_per_token'] / g:,.1f} ({a['indexer_layers']} layers "
            f"run one) + MLA over the top {a['index_topk']:,} {a['sparse_mla_flops_per_token'] / g:,.1f}, "
            f"{dsa / a['model_flops_per_token']:.0%} of the model's {a['model_flops_per_token'] / g:,.1f}; dense MLA "
            f"of the same model {a['dense_mla_flops_per_token'] / g:,.1f} {unit} "
            f"({a['dense_mla_flops_per_token'] / dsa:.1f}× DSA's)")


def summary_line(report: dict) -> str:
    """One line for the trainer's start-up log."""
    w, lay = report["worst"], report["layout"]
    where = "CPU layout" if report["target"] == "cpu" else report["gpu"]["name"]
    rank = next(r for r in report["ranks"] if r["pp_rank"] == w["pp_rank"])
    state = (rank["params_bytes"] + rank["grads_bytes"] + rank["optimizer_bytes"]) / GIB
    micro = f"{rank['in_flight']} micro-batch" + ("" if rank["in_flight"] == 1 else "es")
    return (f"plan ({where}): worst pipeline rank {w['pp_rank']} {w['total_bytes'] / GIB:.2f} GiB = state "
            f"{state:.2f} + activations {rank['activation_bytes'] / GIB:.2f} ({micro} in flight), bubble "
            f"{report['bubble_fraction']:.1%}, TP{lay['tp']}×PP{lay['pp']}"
            + (f"×CP{lay['cp']}" if lay["cp"] > 1 else "") + f"×DP{lay['dp']}")


def startup_line(cfg, world: int, platform) -> str:
    """The trainer's one-line plan (rank 0 at start): for the CPU layout on CPU, else for this GPU."""
    from megatron_mtp.errors import UserError
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import DEFAULT, KNOWN, Gpu

    gpu = KNOWN[DEFAULT]
    if not platform.is_cpu:
        import torch

        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        gpu = Gpu(props.name, props.total_memory)
    try:
        return summary_line(build(make_plan(cfg, world, gpu, cpu=platform.is_cpu), with_suggestions=False))
    except UserError as exc:
        return f"plan: not available for this run ({exc})"
