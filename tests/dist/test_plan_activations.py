"""The plan's saved-activation inventory equals what megatron-core's layers save for backward on CPU.

One process builds the model for each case (sizes x recompute settings, fp32 and bf16) and counts
the bytes of every tensor saved for backward (tests/dist/scripts/activation_check.py). The plan
computes the same groups with the CPU kernels (plan.activations.cpu_kernels, which carry the chunked
output loss where the case turns it on); the GPU plan uses the same inventory with the Transformer
Engine kernels.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from recompute_settings import RECOMPUTE, SELECTIVE_MODULES

from megatron_mtp.config import load_config, pipeline_layout
from megatron_mtp.mtp_styles.parallel import plan as heads_plan
from megatron_mtp.mtp_styles.sequential import plan as modules_plan
from megatron_mtp.plan import activations as act
from megatron_mtp.plan import memory
from megatron_mtp.platform.gpus import parse_gpu
from tests.workers.pool import POOL

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "tiny_cpu.yaml")
SIZES = {
    "tiny_fp32": (["model.vocab_size=1000", "model.num_layers=2"], 2, 64),
    "wide_fp32": (["model.vocab_size=3000", "model.num_layers=2", "model.hidden_size=256", "model.q_lora_rank=null",
                   "model.num_attention_heads=8", "model.num_experts=16", "model.router_topk=4",
                   "model.router_num_groups=4", "model.router_group_topk=2", "model.moe_ffn_hidden_size=128"], 1, 256),
    "tiny_bf16": (["model.vocab_size=1000", "model.num_layers=2", "training.precision=bf16",
                   "model.num_attention_heads=8", "model.hidden_size=192"], 2, 128),
}
MODES = {name: RECOMPUTE[key] for name, key in (
    ("none", "none"), *((m, m) for m in SELECTIVE_MODULES), ("recipe", "recipe"), ("all", "all_selective"),
    ("full", "full_uniform"))}
STYLES = {
    "sequential": [],
    "parallel": ["mtp.style=parallel", "mtp.num_layers=2"],
    # Gloeckle's order: the heads' graphs are freed in the forward; their gradients wait instead
    "head_by_head": ["mtp.style=parallel", "mtp.num_layers=2", "mtp.head_by_head_backward=true"],
}
CHUNKED = ["kernels.chunked_output_loss=true", "kernels.output_loss_chunk=50"]  # no logits kept
STYLES.update({"chunked": CHUNKED, "chunked_self": [*CHUNKED, "mtp.targets=self", "mtp.num_layers=2"],
               "chunked_parallel": [*CHUNKED, *STYLES["parallel"]]})
CASES = [(size, mode, "sequential") for size in SIZES for mode in MODES] + [
    ("tiny_fp32", mode, style) for style in ("parallel", "head_by_head") for mode in ("none", "recipe", "full")] + [
    ("tiny_fp32", "none", "chunked"), ("tiny_bf16", "recipe", "chunked"), ("tiny_fp32", "none", "chunked_self"),
    ("tiny_fp32", "none", "chunked_parallel")]


def _config(size: str, mode: str, style: str):
    overrides, batch, seq = SIZES[size]
    return load_config(CONFIG, overrides + MODES[mode] + STYLES[style] + [f"training.seq_length={seq}"]), batch


def expected(size: str, mode: str, style: str) -> dict:
    cfg, batch = _config(size, mode, style)
    vocab = memory.resolve_vocab(cfg)
    d = act.dims_of(cfg, vocab, batch=batch)
    k, mods = memory.target(cfg, cpu=True).kernels, memory.recompute_modules(cfg)
    full = cfg.recompute.granularity == "full"
    layer = (lambda moe: act.full_recompute_layer(d).total) if full else (
        lambda moe: act.decoder_layer(d, k, mods, moe, grouped_gemm=False).total)
    (stage,) = pipeline_layout.stages(cfg.model.num_layers, cfg.mtp.num_layers, 1, None, None)
    n = cfg.mtp.num_layers
    sizes = memory.make_plan(cfg, 1, parse_gpu("h100"), cpu=True).sizes
    grads = memory.head_grad_bytes(cfg, sizes, stage, vocab, te=False)
    output = act.final_norm(d, k).total
    if style in ("sequential", "chunked", "chunked_self"):
        mtp = n * (modules_plan.mtp_wrapper(d, k, full).total + (0 if full else layer(True)))
        output += act.output_and_loss(d, k, n, soft=cfg.mtp.targets != "tokens").total
    elif style in ("parallel", "chunked_parallel"):  # heads are not recomputed under full recompute
        mtp = n * (heads_plan.parallel_head(d, k).total + act.decoder_layer(d, k, mods, True, grouped_gemm=False).total)
        output += act.output_and_loss(d, k, n, trunk_saved=act.heads_share_trunk(d, k)).total
    else:  # the held gradients are saved by the model itself, outside the heads
        mtp = 0
        output += act.output_and_loss(d, k, 0).total + heads_plan.head_by_head_held(d, grads).total
    return {
        "dense": layer(False), "moe": layer(True), "mtp": mtp, "output": output,
        "total": memory.chunk_activations(cfg, stage, d, k, grouped_gemm=False, head_grad_bytes=grads).total,
    }


@pytest.fixture(scope="module")
def measured():
    cases = [{"overrides": SIZES[s][0] + MODES[m] + STYLES[st], "batch": SIZES[s][1], "seq": SIZES[s][2]}
             for s, m, st in CASES]
    script = Path(__file__).parent / "scripts" / "activation_check.py"
    proc = POOL.run([str(script), CONFIG, json.dumps(cases)], timeout=1500, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(zip(CASES, json.loads(proc.stdout.strip().splitlines()[-1])))


@pytest.mark.parametrize("size,mode,style", CASES)
def test_saved_bytes_per_layer_match(measured, size, mode, style):
    got = measured[(size, mode, style)]
    want = expected(size, mode, style)
    layers = {"dense": got.get("layer0", 0), "moe": got.get("layer1", 0)}
    if mode == "full":  # each layer's checkpoint input is saved by the decoder around it
        layers = {"dense": got.get("decoder", 0) / 2, "moe": got.get("decoder", 0) / 2}
    got = {**layers, "mtp": got.get("mtp", 0), "output": got.get("output", 0), "total": sum(got.values())}
    if style == "head_by_head":  # the heads keep nothing of their own; the trunk output they read is
        # the main output layer's input, counted on whichever side saved it first
        got["output"] += got.pop("mtp")
        want["output"] += want.pop("mtp")
    ratios = {key: want[key] / got[key] if got[key] else float(want[key] == 0) for key in want}
    print(size, mode, style, {key: round(r, 4) for key, r in ratios.items()})
    assert all(abs(r - 1) < 0.10 for r in ratios.values()), (ratios, want, got)
