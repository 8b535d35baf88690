"""`plan --smallest` (and tools/smallest_layout.py, which calls it): the layout it prints fits by `plan`, no
layout of one node fewer does, and a search where nothing fits stops early."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FROZEN = ["mtp.freeze_base=true", "checkpoint.load=/a/model", "recompute.granularity=none"]


def _search(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "tools" / "smallest_layout.py"), *args],
                          capture_output=True, text=True, cwd=ROOT, timeout=300)


def test_the_printed_layout_fits_and_one_node_fewer_does_not():
    from megatron_mtp.config import load_config
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import parse_gpu

    out = _search("configs/glm4_5.yaml", "--gpu", "h100", *FROZEN)
    assert out.returncode == 0, out.stderr
    assert "smallest fitting world 16 GPUs" in out.stdout
    command = next(line for line in out.stdout.splitlines() if line.startswith("reproduce: "))
    words = command.split()[4:]  # after "reproduce: megatron-mtp plan CONFIG"
    overrides = [w for w in words if "=" in w]
    cfg = load_config(str(ROOT / "configs" / "glm4_5.yaml"), overrides)
    assert make_plan(cfg, 16, parse_gpu("h100"), cpu=False, imbalance=1.0).fits
    # minimal: at 8 GPUs the same search finds nothing
    fewer = _search("configs/glm4_5.yaml", "--gpu", "h100", "--max-nodes", "1", *FROZEN)
    assert fewer.returncode == 1 and "no layout up to 1 nodes fits" in fewer.stderr


def test_nothing_fits_stops_after_the_most_sharded_layouts_and_says_so():
    out = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", "configs/glm4_5.yaml", "--smallest",
                          "--gpu", "1", "--max-nodes", "16"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 3, out.stderr
    assert lines[1].startswith("  16 node(s), 128 GPUs: 4 most sharded layouts planned, 0 fit; lowest worst rank")
    assert lines[2].startswith("no layout up to 16 nodes fits configs/glm4_5.yaml on 1 GiB GPU: even at 128 GPUs "
                               "the lowest worst rank is")


def test_a_data_parallel_shard_counts_what_a_walk_over_every_parameter_counts():
    """Buffer.shard bisects; the walk below is megatron-core's definition, parameter by parameter."""
    import random

    from megatron_mtp.plan.params import Buffer

    rng = random.Random(0)
    for _ in range(200):
        dp, pos, params = rng.choice([1, 2, 3, 8, 16]), 0, []
        for _ in range(rng.randint(1, 30)):
            pos += rng.choice([0, 0, 3, 64])
            n = rng.randint(1, 500)
            params.append((pos, pos + n))
            pos += n
        buckets, start = [], 0
        for cut in sorted(rng.sample(range(1, pos + 1), k=min(3, pos))) + [pos]:
            if cut > start:
                end = start + -(-(cut - start) // dp) * dp
                buckets.append((start, end))
                start = end
        b = Buffer(expert=False, fp8=False, dp=dp, numel=start, buckets=tuple(buckets), params=tuple(params))
        for r in range(dp):
            walk_elements = walk_params = 0
            for b0, b1 in b.buckets:
                lo, hi = b0 + r * ((b1 - b0) // dp), b0 + (r + 1) * ((b1 - b0) // dp)
                walk_elements += sum(max(0, min(hi, e) - max(lo, s)) for s, e in params)
                walk_params += sum(1 for s, e in params if min(hi, e) > max(lo, s))
            assert b.shard(r) == (walk_elements, walk_params)
        assert b.shards() == [b.shard(r) for r in range(dp)]  # every rank at once, as arrays


def test_no_layout_passing_the_checks_at_the_most_nodes_still_searches_fewer():
    """The tiny config's batch of 16 cannot spread over 1,024 GPUs, so no layout passes its checks at 128
    nodes; that says nothing of one node, where it fits."""
    out = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", "configs/tiny_cpu.yaml", "--smallest"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "128 node(s), 1024 GPUs: 0 most sharded layouts planned" in out.stderr
    assert "smallest fitting world 8 GPUs (1 node(s) x 8)" in out.stdout


def test_zero_gpus_per_node_is_refused_not_the_default():
    out = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", "configs/tiny_cpu.yaml", "--smallest",
                          "--gpus-per-node", "0"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 2 and "--gpus-per-node (0)" in out.stderr and "must be at least 1" in out.stderr


def test_the_search_tries_mtp_on_a_stage_of_its_own():
    from megatron_mtp.config import load_config
    from megatron_mtp.config.pipeline_layout import stages

    out = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", "configs/tiny_cpu.yaml", "--smallest",
                          "--gpu", "h100", "--max-nodes", "1"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr
    alone = [line for line in out.stdout.splitlines() if "(MTP on a stage of its own)" in line]
    assert alone and all(" x PP1 " not in line for line in alone), out.stdout  # only where there is a pipeline
    command = next(line for line in out.stdout.splitlines() if line.startswith("reproduce: "))
    overrides = [w for w in command.split()[4:] if "=" in w]
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), overrides)
    assert "parallel.pipeline_layout=[4,0]" in overrides, command  # the best: the output layer's stage lightest
    last = stages(4, 1, cfg.parallel.pipeline, None, cfg.parallel.pipeline_layout)[-1]
    assert (last.layers, last.mtp_layers, last.loss) == ((), 1, True)


def _plan_smallest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", *args, "--smallest"], capture_output=True,
                          text=True, cwd=ROOT, timeout=300)


def test_the_671b_recipe_is_planned_though_its_61_layers_split_evenly_over_no_pipeline():
    """61 layers split over no PP > 1, and the recipe's all-to-all overlap refuses PP1 with MTP and PP > 1
    without a virtual pipeline: the search plans uneven splits with the overlap off instead of nothing."""
    out = _plan_smallest("configs/deepseek_v3_671b.yaml", "--max-nodes", "16")
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and lines[1].startswith(
        "  16 node(s), 128 GPUs: 4 most sharded layouts planned, 0 fit; lowest worst rank"), out.stderr
    assert "no layout up to 16 nodes fits configs/deepseek_v3_671b.yaml on H100 80 GB: even at 128 GPUs" in lines[2]


def test_uneven_splits_with_the_overlap_off_are_found_and_reproduce_with_plan():
    from megatron_mtp.config import load_config
    from megatron_mtp.config.pipeline_layout import stages
    from megatron_mtp.plan.memory import make_plan
    from megatron_mtp.platform.gpus import parse_gpu

    # 5 layers (no even split over PP2 or PP4), the overlap on, which the recipe's own layout string allows
    recipe = ["model.num_layers=5", "training.precision=bf16", "parallel.expert=2", "parallel.pipeline=2",
              "parallel.pipeline_layout=Et|tt|t|tmL", "parallel.moe_a2a_overlap=true", "training.micro_batch_size=4"]
    out = _plan_smallest("configs/tiny_cpu.yaml", *recipe, "--max-nodes", "1")
    assert out.returncode == 0, out.stderr
    assert "x PP2 x" in out.stdout and "(layers [3,2]; MoE all-to-all overlap off)" in out.stdout, out.stdout
    assert "the search tries no virtual pipeline" in out.stdout
    command = next(line for line in out.stdout.splitlines() if line.startswith("reproduce: "))
    overrides = [w for w in command.split()[4:] if "=" in w]
    assert "parallel.moe_a2a_overlap=false" in overrides and "parallel.delay_wgrad_compute=false" in overrides
    cfg = load_config(str(ROOT / "configs" / "tiny_cpu.yaml"), overrides)
    assert make_plan(cfg, 8, parse_gpu("h100"), cpu=False, imbalance=1.0).fits
    layers = [len(s.layers) for s in stages(5, 1, cfg.parallel.pipeline, None, cfg.parallel.pipeline_layout)]
    assert sum(layers) == 5


def test_a_check_that_refuses_every_layout_is_named():
    out = _plan_smallest("configs/tiny_cpu.yaml", "--gpus-per-node", "3", "--max-nodes", "1")
    last = out.stderr.strip().splitlines()[-1]
    assert out.returncode == 1 and "passes configs/tiny_cpu.yaml's own checks: the one refusing the most" in last
    assert "training.global_batch_size=16 must be a multiple of micro_batch_size × data-parallel size" in last, last
    assert "raise --max-nodes" not in last
