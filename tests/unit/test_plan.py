"""`megatron-mtp plan` without processes: speed, recipes, independent estimates, schedule, bad input.

Agreement with real ranks is in tests/dist/test_plan_exact.py and test_plan_activations.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from megatron_mtp.cli import main
from megatron_mtp.config import load_config
from megatron_mtp.errors import UserError
from megatron_mtp.launch.job_plan import SubmitRequest, build_plan
from megatron_mtp.mtp_styles.parallel import plan as heads_plan
from megatron_mtp.plan import activations as act
from megatron_mtp.plan import comm, memory, report, schedule
from megatron_mtp.plan.memory import make_plan
from megatron_mtp.platform import megatron_core
from megatron_mtp.platform.detect import Platform
from megatron_mtp.platform.gpus import GIB, KNOWN, parse_gpu

ROOT = Path(__file__).resolve().parents[2]
V3 = str(ROOT / "configs" / "deepseek_v3_671b.yaml")


def _strict(text: str) -> dict:
    def refuse(name):
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def test_671b_plan_takes_seconds_without_torch():
    code = textwrap.dedent(f"""
        import sys, time
        start = time.perf_counter()
        from megatron_mtp.cli import main
        rc = main(["plan", "{V3}", "--nodes", "128", "--gpus-per-node", "8", "--json", "--mfu", "0.3"])
        assert rc == 0
        assert "torch" not in sys.modules and "megatron" not in sys.modules, "plan imported torch"
        print("SECONDS", time.perf_counter() - start)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    body, seconds = proc.stdout.rsplit("SECONDS", 1)
    assert float(seconds) < 10
    plan = _strict(body)
    assert plan["world"] == 1024 and plan["layout"] == {"tp": 2, "pp": 8, "vpp": 4, "cp": 1, "dp": 64, "ep": 64,
                                                        "etp": 1, "edp": 2}
    assert plan["worst"]["fits"] and len(plan["ranks"]) == 8
    assert plan["ranks"][0]["in_flight"] == 2 * 7 + 3 * 8 + 1 + 1  # interleaved warm-up (+1 with A2A overlap) + 1
    assert plan["time"]["step_seconds"] > 0 and plan["assumptions"]


RECIPES = {  # config, nodes x GPUs per node, GPU, overrides (README "Plan before you submit")
    "671b_h100": (V3, 128, 8, "h100", []),
    "671b_h200": (V3, 128, 8, "h200", ["recompute.granularity=none"]),
    "proxy_2x8": (str(ROOT / "configs" / "proxy_16b.yaml"), 2, 8, "h100", []),
    "proxy_1node": (str(ROOT / "configs" / "proxy_16b_1node.yaml"), 1, 8, "h100", []),
    "glm5_h100": (str(ROOT / "configs" / "glm5.yaml"), 128, 8, "h100", []),
}


@pytest.mark.parametrize("name", list(RECIPES))
def test_shipped_recipes_fit(name):
    config, nodes, per_node, gpu, overrides = RECIPES[name]
    if name.startswith("glm5") and not megatron_core.is_019():
        pytest.skip("GLM-5's DSA modules are megatron-core 0.19's")
    plan = make_plan(load_config(config, overrides), nodes * per_node, parse_gpu(gpu))
    assert plan.fits, (name, plan.worst.total / GIB)
    assert plan.worst.total < 0.9 * plan.gpu.memory_bytes  # headroom for routing imbalance and fragmentation


# Independent analytic estimates (shared notes "deepseek-v3-recipes.md"), GiB before workspaces.
BRIDGE = ["parallel.tensor=2", "parallel.pipeline=16", "parallel.pipeline_layout=Etttt|(tttt|)*14tmL",
          "parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false", "training.global_batch_size=4096"]
TP1_PP16 = ["parallel.tensor=1", "parallel.pipeline=16", "parallel.pipeline_layout=Etttt|(tttt|)*14tmL",
            "recompute.granularity=none", "optimizer.precision_aware=false", "optimizer.moment_dtype=fp32",
            "training.fp8_param_gather=false", "parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false",
            "kernels.cross_entropy_fusion='off'", "training.global_batch_size=8192"]
ESTIMATES = {
    "tp1_pp16_ep64_fp8": (V3, 1024, TP1_PP16, 111),
    "tp1_pp16_ep64_bf16": (V3, 1024, TP1_PP16 + ["training.fp8=null"], 122),
    "nvidia_h100_recipe": (V3, 1024, [], 56),
    "bridge_bf16_grads_moments": (V3, 1024, BRIDGE + ["training.grad_reduce_dtype=bf16", "training.fp8=null",
                                                      "training.fp8_param_gather=false", "recompute.granularity=none"],
                                  66),
    "proxy_pp2_ep8": (str(ROOT / "configs" / "proxy_16b.yaml"), 16, ["recompute.granularity=none"], 34),
}


@pytest.mark.parametrize("name", list(ESTIMATES))
def test_agrees_with_independent_estimates(name):
    config, world, overrides, gib = ESTIMATES[name]
    worst = make_plan(load_config(config, overrides), world, parse_gpu("h100")).worst
    ours = (worst.total - worst.workspace) / GIB
    assert abs(ours / gib - 1) < 0.10, (name, ours, gib)


def test_schedule_replay_matches_megatron_formulas():
    for pp in (1, 2, 4, 8):
        for chunks in ((1, 2, 4) if pp > 1 else (1,)):
            for micro in (pp, 2 * pp, 3 * pp, 16):
                if chunks > 1 and micro % pp:
                    continue
                for rank in range(pp):
                    events = schedule.events(pp, rank, chunks, micro)
                    assert sorted(e[1:] for e in events if e[0] == "F") == sorted(
                        (mb, c) for mb in range(micro) for c in range(chunks))
                    peak = schedule.peak(pp, rank, chunks, micro)
                    assert peak.in_flight == schedule.max_in_flight(pp, rank, chunks, micro)
                    if chunks == 1:  # 1F1B: rank r holds p - r micro-batches (at most all of them)
                        assert peak.in_flight == min(pp - rank, micro)
    assert schedule.bubble_fraction(8, 4, 240) == pytest.approx(7 / 967)


def test_schedule_peak_of_a_short_replay_is_the_peak_of_the_whole_step():
    """peak replays a few whole groups of micro-batches (the steady state repeats); the full replay of every
    micro-batch, with uneven chunk weights, must give the same peak."""
    import random

    rng = random.Random(1)
    for pp in (2, 4, 8):
        for chunks in (1, 2, 4):
            for micro in (8 * pp, 24 * pp + (0 if chunks > 1 else 3)):
                for a2a in (False, True):
                    for rank in range(pp):
                        weights = [rng.uniform(0.5, 2.0) for _ in range(chunks)]
                        live, best = [0] * chunks, (0.0, 0)
                        for kind, _, chunk in schedule.events(pp, rank, chunks, micro, a2a):
                            live[chunk] += 1 if kind == "F" else -1
                            best = max(best, (sum(n * w for n, w in zip(live, weights)), sum(live)))
                        got = schedule.peak(pp, rank, chunks, micro, weights, a2a)
                        assert (got.bytes, got.in_flight) == pytest.approx(best), (pp, chunks, micro, rank)
    assert schedule._replayed(8, 0, 4, 3840, False) < 100  # the replay really is short


@pytest.mark.parametrize("args,message", [
    (["--gpu", "a100x"], "is not a GPU the plan knows"),
    (["parallel.pipeline=3"], "parallel.pipeline is 3"),
    (["--gpus-per-node", "7", "parallel.world_size=null"], "is not a multiple of expert tensor × expert × pipeline"),
    (["--mfu", "40"], "--mfu 40.0 must be a fraction"),
    (["--routing-imbalance", "0.5"], "--routing-imbalance 0.5 must be at least 1"),
    (["--routing-imbalance", "nan"], "--routing-imbalance nan must be at least 1"),
    (["model.vocab_size=null", "data.paths=[/data/x]"], "model.vocab_size is null"),
    # the recipe a GPU generation cannot run, before any GPU is allocated (platform/low_precision.py)
    (["training.fp8=mxfp8"], "training.fp8=mxfp8 does not run on the H100 80 GB (Hopper, 9.0)"),
    (["--gpu", "h200", "training.fp8=nvfp4"], "use training.fp8=blockwise or tensorwise there"),
])
def test_bad_input_is_one_sentence(args, message, capsys):
    argv = ["plan", V3, "--nodes", "128"] + (["--gpus-per-node", "8"] if "--gpus-per-node" not in args else []) + args
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1 and "Traceback" not in err, err


def test_known_gpus_and_sizes():
    assert parse_gpu(None) == KNOWN["h100"] and parse_gpu("H200").memory_bytes > 139 * GIB
    assert parse_gpu("96").memory_bytes == 96 * GIB and parse_gpu("120GiB").memory_bytes == 120 * GIB
    with pytest.raises(UserError):
        parse_gpu("-3")


@pytest.mark.parametrize("device,key", [
    ("NVIDIA H100 80GB HBM3", "h100"), ("NVIDIA H100 PCIe", "h100-pcie"), ("NVIDIA H100 NVL", "h100-nvl"),
    ("NVIDIA H200", "h200"), ("NVIDIA B200", "b200"), ("NVIDIA GB200", "gb200"),
    ("NVIDIA H200 NVL", None), ("NVIDIA GH200 480GB", None), ("NVIDIA H800", None), ("NVIDIA A100-SXM4-80GB", None),
])
def test_a_cuda_device_name_gets_its_own_peak_or_none(device, key):
    """torch.cuda.get_device_name() strings: a PCIe or NVL H100 is not the SXM part, a GB200 not the B200."""
    from megatron_mtp.models.throughput import gpu_of_device

    assert gpu_of_device(device) is (KNOWN[key] if key else None)


def test_the_pcie_nvl_and_gb200_peaks_are_the_data_sheets_dense_ones():
    peaks = {key: (KNOWN[key].bf16_tflops, KNOWN[key].fp8_tflops) for key in ("h100", "h100-pcie", "h100-nvl",
                                                                              "b200", "gb200")}
    assert peaks == {"h100": (989.0, 1979.0), "h100-pcie": (756.0, 1513.0), "h100-nvl": (835.0, 1670.0),
                     "b200": (2250.0, 4500.0), "gb200": (2500.0, 5000.0)}
    assert parse_gpu("h100-nvl").memory_bytes == 95830 * 2**20 and parse_gpu("gb200").capability == (10, 0)


def test_the_671b_recipe_trains_deepseek_v3s_tokens():
    """14.8T tokens at its batch and sequence; the ramp its comment gives reaches them in the steps it says."""
    from megatron_mtp.config.validate import validate
    from megatron_mtp.training.batch_ramp import ramped_global_batch

    t = load_config(V3).training
    per_step = t.global_batch_size * t.seq_length
    assert 0 <= t.max_steps * per_step - 14.8e12 < per_step
    ramp = load_config(V3, ["training.rampup_batch_size=[3072,512,114501953]", "training.max_steps=243425"])
    validate(ramp)  # its sizes divide over the recipe's micro batch × DP × PP
    assert 114501953 * 4096 == pytest.approx(469e9, rel=1e-8)
    consumed, steps = 0, 0
    while consumed * t.seq_length < 14.8e12:
        consumed += ramped_global_batch(consumed, 3072, 512, 114501953, t.global_batch_size)
        steps += 1
    assert steps == ramp.training.max_steps


def test_mfu_says_which_peak_it_is_a_share_of(capsys):
    assert main(["plan", V3, "--nodes", "128", "--mfu", "0.4"]) == 0
    assert "at 40% MFU of the FP8 dense peak (1979 TFLOP/s; 80% of the bf16 peak)" in capsys.readouterr().out
    assert main(["plan", V3, "training.fp8=null", "training.fp8_param_gather=false", "--nodes", "128",
                 "--mfu", "0.4"]) == 0
    assert "at 40% MFU of the BF16 dense peak (989 TFLOP/s)," in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["plan", "--help"])
    assert "the FP8 peak when training.fp8 is set" in " ".join(capsys.readouterr().out.split())


def test_table_and_cpu_summary():
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), ["parallel.pipeline=2"])
    plan = make_plan(cfg, 2, parse_gpu("h100"), cpu=True)
    table = report.format_table(report.build(plan))
    assert "CPU processes" in table and "assumptions:" in table and "in-flight" in table
    line = report.startup_line(cfg, 2, Platform(device="cpu", backend="gloo", use_te=False))
    assert line.startswith("plan (CPU layout): worst pipeline rank 1") and "in flight" in line


@pytest.mark.skipif(not megatron_core.is_019(), reason="GLM-5's DSA modules are megatron-core 0.19's")
def test_dsa_activations_by_hand_and_the_report_puts_dsa_beside_dense_mla():
    """configs/glm_moe_dsa_tiny_cpu.yaml on CPU (fp32, 8 × 128 tokens, 4 heads, kv_lora 32, rope 16, a 4 × 32 indexer
    learning from its KL loss, top 16): layer 0 runs its indexer, layer 1 reuses its top-k and keeps none of it;
    the unfused scores are three fp32 [8, 4, 128, 128] tensors and three bool masks of that shape (at CP2 a rank's
    half of the queries over every key: [8, 4, 64, 128], the indexer's keys whole). The table says
    DSA's attention FLOPs beside dense MLA's; a dense family's has no such line."""
    cfg = load_config(str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml"), ["model.vocab_size=4096"])
    d, k = act.dims_of(cfg, 4096), act.CPU_KERNELS
    full, shared = (act.decoder_layer(act.layer_dims(cfg, d, i), k, frozenset(), False, False) for i in (0, 1))
    t = 8 * 128
    indexer = (t * 4 * 32 * 4 + t * 32 * 4 + t * 4 * 4  # its query, key and head weights
               + t * (32 * 4 + 2 * 4)  # its key norm's input, mean and 1/std
               + 4 * 128 * 16 * 4  # its RoPE's cos and sin for q and k
               + t * 16 * 8  # the top-k indices (int64)
               + t * (4 + 1) * (32 + 16) * 4)  # the absorbed query and the latent key its KL loss reads
    assert full.total - shared.total == indexer
    assert full.items["attn.probs"] == 3 * 8 * 4 * 128 * 128 * 4 and full.items["attn.masks"] == 3 * 8 * 4 * 128 * 128
    cp = load_config(str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml"),
                     ["model.vocab_size=4096", "parallel.context=2"])
    half = act.decoder_layer(act.layer_dims(cp, act.dims_of(cp, 4096), 0), k, frozenset(), False, False)
    # CP2: a rank's 64 queries of each sequence read all 128 keys, gathered (megatron-core's all-gather DSA)
    assert half.items["attn.probs"] == 3 * 8 * 4 * 64 * 128 * 4 and half.items["indexer.k"] == t * 32 * 4
    assert half.items["indexer.q"] == t // 2 * 4 * 32 * 4
    built = report.build(make_plan(cfg, 1, parse_gpu("h100"), cpu=True))
    table = report.format_table(built)
    assert built["attention"]["indexer_layers"] == 2 and "dense MLA of the same model" in table
    assert "DeepSeek Sparse Attention: megatron-core's unfused PyTorch path" in table
    plain = report.build(make_plan(load_config(str(ROOT / "configs" / "tiny_cpu.yaml")), 1, parse_gpu("h100"),
                                   cpu=True))
    assert "attention" not in plain and "dense MLA of the same model" not in report.format_table(plain)


def test_submit_refuses_a_layout_over_memory(tmp_path):
    over = ["recompute.granularity=none", "optimizer.precision_aware=false", "optimizer.moment_dtype=fp32",
            "training.fp8_param_gather=false"]
    request = dict(config=V3, overrides=over, nodes=128, gpus_per_node=8, run_dir=str(tmp_path / "run"))
    # the recipe ships data.paths null: submit refuses to train 671B parameters on the default corpus
    with pytest.raises(UserError, match=r"data.paths is not set, so this 682.6B-parameter model would train on "
                                        r"the embedded default corpus .*set data.paths to your preprocessed corpus"):
        build_plan(SubmitRequest(**dict(request, force=True)))
    for ext in (".bin", ".idx"):
        (tmp_path / f"corpus{ext}").touch()
    request["overrides"] = over + [f"data.paths=[{tmp_path / 'corpus'}]"]
    with pytest.raises(UserError) as refused:
        build_plan(SubmitRequest(**request))
    text = str(refused.value)
    assert "pipeline rank 2 needs" in text and "recompute.modules=[mla_up_proj,mlp]" in text and "--force" in text
    forced = build_plan(SubmitRequest(**request, force=True))
    assert "submitted with --force" in forced.memory
    assert build_plan(SubmitRequest(**request, gpu="h200")).memory.startswith("memory plan: pipeline rank")
    cpu = build_plan(SubmitRequest(config=str(ROOT / "configs" / "tiny_cpu.yaml"), cpu=True,
                                   run_dir=str(tmp_path / "cpu")))
    assert cpu.memory is None


def test_parallel_heads_plan_no_embedding_copy_and_head_by_head_holds_gradients():
    # one head, in the recipe layout's one 'm' (the all-to-all overlap builds only sequential MTP)
    base = ["mtp.style=parallel", "parallel.moe_a2a_overlap=false", "parallel.delay_wgrad_compute=false"]
    plain = make_plan(load_config(V3, base), 1024, parse_gpu("h100"))
    last = [s for s in memory.model_stages(plain.cfg) if s.pp_rank == plain.sizes.pp - 1][-1]
    names = [p.name for p in memory.chunk_params(plain.cfg, plain.sizes, last, memory.resolve_vocab(plain.cfg),
                                                 last=True, te=True)]
    assert "embedding.word_embeddings.weight" not in names and not any(n.startswith("mtp.") for n in names)
    assert sum(n.startswith("mtp_heads.layers.0.") for n in names) > 0
    assert comm.step_bytes(plain.cfg, plain, plain.sizes.pp - 1)["embedding"] == 0
    sequential = make_plan(load_config(V3), 1024, parse_gpu("h100"))
    assert comm.step_bytes(sequential.cfg, sequential, sequential.sizes.pp - 1)["embedding"] > 0
    by_head = make_plan(load_config(V3, [*base, "mtp.head_by_head_backward=true",
                                         "kernels.gradient_accumulation_fusion=false"]), 1024, parse_gpu("h100"))
    # the last chunk's micro-batch: no heads' activations or logits, but their parameter gradients
    assert by_head.ranks[-1].chunk_bytes[-1] != plain.ranks[-1].chunk_bytes[-1]
    d = act.dims_of(plain.cfg, memory.resolve_vocab(plain.cfg), 1.0)
    grads = memory.head_grad_bytes(by_head.cfg, by_head.sizes, last, memory.resolve_vocab(by_head.cfg), te=True)
    k, mods = plain.target.kernels, memory.recompute_modules(plain.cfg)
    heads = heads_plan.parallel_head(d, k).total + act.decoder_layer(d, k, mods, True, True).total
    # plain: the heads' layers keep the trunk the main output layer reads; head by head: the output layer does
    logits = (act.output_and_loss(d, k, 1, trunk_saved=act.heads_share_trunk(d, k)).total -
              act.output_and_loss(d, k, 0).total)
    saved = by_head.ranks[-1].chunk_bytes[-1] - plain.ranks[-1].chunk_bytes[-1]
    assert saved == pytest.approx(heads_plan.head_by_head_held(d, grads).total - heads - logits)


def test_checkpoint_save_host_memory_per_optimizer_format():
    """The reshardable format gathers every data-parallel shard onto each rank; the parallel one keeps
    its own: at DP=1 they are the same, at DP=4 the parallel one is a quarter (bucket padding aside)."""
    tiny = str(ROOT / "configs" / "tiny_cpu.yaml")
    dense = ["model.num_experts=0", "model.first_k_dense=0", "training.micro_batch_size=1"]
    one = make_plan(load_config(tiny, dense), 1, parse_gpu("h100"))
    four = make_plan(load_config(tiny, dense), 4, parse_gpu("h100"))
    for plan in (one, four):
        assert plan.worst.save_host["reshardable"] == one.worst.save_host["reshardable"] > 0
    assert one.worst.save_host["parallel"] == one.worst.save_host["reshardable"]
    assert abs(four.worst.save_host["parallel"] * 4 / four.worst.save_host["reshardable"] - 1) < 0.01
    text = report.format_table(report.build(four))
    assert "checkpoint save, host memory of the worst rank:" in text and "optimizer_format=parallel" in text


def test_a_capacity_caps_or_fixes_the_routed_tokens_the_plan_counts():
    h100 = parse_gpu("h100")

    def worst(overrides, imbalance):
        return make_plan(load_config(V3, overrides), 1024, h100, imbalance=imbalance).worst.total

    assert worst([], 2.0) > worst([], 1.25)  # more routed tokens, more memory
    assert worst(["model.moe_capacity_factor=1.25"], 2.0) == worst([], 1.25)  # dropped beyond the capacity
    assert worst(["model.moe_capacity_factor=1.5", "model.moe_pad_to_capacity=true"], 1.0) == worst([], 1.5)


def test_low_precision_recipes_by_gpu_generation(tmp_path):
    from megatron_mtp.platform.low_precision import check_recipe

    for gpu in ("h100", "h200", "b200"):
        make_plan(load_config(V3), 1024, parse_gpu(gpu))  # the recipe's blockwise runs on all three
    for recipe in ("mxfp8", "nvfp4"):
        make_plan(load_config(V3, [f"training.fp8={recipe}"]), 1024, parse_gpu("b200"))
        make_plan(load_config(V3, [f"training.fp8={recipe}"]), 1024, parse_gpu("141"))  # unknown kind: unchecked
    with pytest.raises(UserError, match="needs compute capability 8.9 or newer .* the A100 is 8.0"):
        check_recipe("tensorwise", (8, 0), "A100")
    with pytest.raises(UserError, match=r"the RTX PRO 6000 \(Blackwell workstation, 12.0\)"):
        check_recipe("mxfp8", (12, 0), "RTX PRO 6000")
    check_recipe("blockwise", (12, 0), "RTX PRO 6000")
    request = SubmitRequest(config=V3, overrides=["training.fp8=mxfp8", f"data.paths=[{tmp_path / 'c'}]"],
                            nodes=128, gpus_per_node=8, run_dir=str(tmp_path / "run"), force=True)
    with pytest.raises(UserError, match="training.fp8=mxfp8 does not run on the H100"):
        build_plan(request)  # submit: refused even with --force, which only passes memory


def test_context_parallelism_splits_each_sequence_and_passes_keys_and_values_around_a_ring():
    h100 = parse_gpu("h100")
    short = make_plan(load_config(V3), 1024, h100)
    # DeepSeek-V3's 32K phase on the same GPUs: 8 context-parallel ranks hold 4,096 tokens of a sequence each,
    # the dense state shards over data × context ranks (8 × 8, as the 64 data ranks of the 4K run)
    long = make_plan(load_config(V3, ["training.seq_length=32768", "parallel.context=8",
                                      "training.global_batch_size=1920"]), 1024, h100)
    # (its global batch of 1,920 sequences is the 4K run's 15,360 at 8x the length: the same micro-batches)
    assert (long.sizes.cp, long.sizes.dp) == (8, 8) and long.num_micro == short.num_micro
    assert [r.total for r in long.ranks] == [r.total for r in short.ranks]
    assert "× CP8 × DP8" in report.format_table(report.build(long))
    # the ring: CP - 1 hops of this rank's keys and values (MLA: the up-projected heads) per layer, forward,
    # and again with their gradients backward
    m, tokens = long.cfg.model, 4096 * long.cfg.training.micro_batch_size
    kv = m.num_attention_heads // 2 * (m.qk_head_dim + m.qk_pos_emb_head_dim + m.v_head_dim)
    layers = sum(len(s.layers) + s.mtp_layers for s in memory.model_stages(long.cfg) if s.pp_rank == 1)
    assert comm.step_bytes(long.cfg, long, 1)["cp"] == 3 * 7 * tokens * kv * 2 * layers * long.num_micro
    assert comm.step_bytes(short.cfg, short, 1)["cp"] == 0


def test_smallest_tries_context_parallelism_for_long_sequences():
    out = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", str(ROOT / "configs" / "tiny_cpu.yaml"),
                          "training.seq_length=16384", "model.max_position_embeddings=16384", "--smallest",
                          "--max-nodes", "1"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert any(" x CP" in line for line in out.stdout.splitlines() if line.startswith("  TP")), out.stdout
