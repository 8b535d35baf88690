"""`megatron-mtp plan` against real ranks: model state to the byte, in-flight micro-batches exactly,
communication and saved activations within 10%.

Each layout runs tests/dist/scripts/plan_check.py on real ranks (gloo, the tiny
model built by training.components.build_components, two training steps on random tokens) and compares
every rank with the plan of the same config for the CPU target.
"""

from __future__ import annotations

import collections
import json
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.vocab import resolve_vocab
from megatron_mtp.plan import comm, schedule
from megatron_mtp.plan.memory import make_plan, model_stages, state_bytes
from megatron_mtp.platform import megatron_core
from megatron_mtp.platform.gpus import parse_gpu
from tests.workers.pool import POOL

pytestmark = pytest.mark.dist
ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "tiny_cpu.yaml")
GLM = str(ROOT / "configs" / "glm4_moe_tiny_cpu.yaml")
QWEN3 = str(ROOT / "configs" / "qwen3_moe_tiny_cpu.yaml")
GEMMA = str(ROOT / "configs" / "gemma4_tiny_cpu.yaml")
GLM5 = str(ROOT / "configs" / "glm_moe_dsa_tiny_cpu.yaml")
BASE = ["model.vocab_size=1000", "model.num_layers=2", "training.seq_length=64", "training.micro_batch_size=2",
        "training.global_batch_size=8"]
ASSISTANT = ["mtp.style=assistant", "mtp.num_layers=2", "mtp.freeze_base=true", "checkpoint.load=/a/model",
             "mtp.assistant.hidden_size=64", "mtp.assistant.num_layers=2", "mtp.assistant.ffn_hidden_size=128"]
LAYOUTS = {
    "tp2": (2, ["parallel.tensor=2"]),
    "pp2": (2, ["parallel.pipeline=2"]),
    "ep2": (2, ["parallel.expert=2"]),
    "tp2_pp2_ep2": (8, ["parallel.tensor=2", "parallel.pipeline=2", "parallel.expert=2",
                        "training.global_batch_size=16"]),
    "pp2_vpp2": (2, ["parallel.pipeline=2", "model.num_layers=4", "parallel.pipeline_layout=Et|t|t|tmL"]),
    "tp2_etp1_ep2": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1",
                         "training.precision=bf16"]),
    # data-parallel sharding of dense and expert buckets, bf16 with fp32 mains, small buckets, overlap
    "dp4_ep2_bf16_buckets": (4, ["parallel.expert=2", "training.precision=bf16", "training.global_batch_size=16",
                                 "parallel.overlap_grad_reduce=true", "parallel.overlap_param_gather=true",
                                 "parallel.bucket_size=20000"]),
    # DeepSeek-V3's last stage: MTP and the loss without decoder layers (the final norm stays behind)
    "pp2_mtp_stage": (2, ["parallel.pipeline=2", "parallel.pipeline_layout=Ett|mL", "training.precision=bf16"]),
    # parallel MTP heads: no embedding copy on the last stage, nothing tied between the stages
    "pp2_parallel_heads": (2, ["parallel.pipeline=2", "mtp.style=parallel", "mtp.num_layers=2"]),
    "tp2_ep2_parallel_heads": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1",
                                   "mtp.style=parallel", "mtp.num_layers=2", "training.precision=bf16"]),
    "dp2_head_by_head": (2, ["mtp.style=parallel", "mtp.num_layers=2", "mtp.head_by_head_backward=true"]),
    # GLM-4.5's grouped-query attention: linear_qkv (with its bias) split over TP by key/value groups,
    # per-head q/k norms whose gradients TP sums
    "glm_tp2_ep2": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"], GLM),
    # Qwen3-MoE: the same attention without its bias, routed experts without shared ones or expert bias
    "qwen3_tp2_ep2": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1"], QWEN3),
    # Gemma 4's own layer modules: per-kind attention, the dense MLP beside the MoE block, the router's scales;
    # tied embeddings with the MTP stage's copy on the last pipeline rank
    "gemma4_tp2_ep2": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1",
                           "model.layer_types=null"], GEMMA),
    "gemma4_pp2_vpp2": (2, ["parallel.pipeline=2", "model.num_layers=4", "parallel.pipeline_layout=Et|t|t|tmL"],
                        GEMMA),
    # GLM-5's DeepSeek Sparse Attention (megatron-core 0.19): absorbed MLA's unfused scores, the indexers learning
    # from their KL loss in layer 0 and the MTP layer, layer 1 reusing layer 0's top-k without one
    "glm5_dsa_bf16": (1, ["training.precision=bf16"], GLM5),
    # MTP-only training (two parallel heads; sequential modules): parameters for all, gradients/optimizer/
    # activations of the MTP path alone (pipeline rank 0 of pp2 trains nothing)
    "frozen_base_heads": (1, ["mtp.freeze_base=true", "checkpoint.load=/a/model", "training.precision=bf16",
                              "mtp.style=parallel", "mtp.num_layers=2"]),
    "pp2_ep2_frozen_base": (4, ["mtp.freeze_base=true", "checkpoint.load=/a/model", "parallel.pipeline=2",
                                "parallel.expert=2"]),
    # Gemma 4's assistant on the frozen target: its own state alone trains; its steps' saved activations and the
    # target's stored keys/values they attend to
    "gemma4_assistant_tp2_ep2": (2, ["parallel.tensor=2", "parallel.expert=2", "parallel.expert_tensor=1",
                                     "model.layer_types=null", *ASSISTANT], GEMMA),
}
FROZEN = {"frozen_base_heads", "pp2_ep2_frozen_base", "gemma4_assistant_tp2_ep2"}
MODELED = ("tp", "ep", "etp", "dp", "edp", "pp", "embedding")


def run(nproc: int, overrides: list[str], out: Path, config: str = CONFIG) -> list[dict]:
    proc = POOL.run([str(Path(__file__).parent / "scripts" / "plan_check.py"), config, *BASE, *overrides], nproc=nproc,
                    timeout=900, env={"PLANCHECK_DIR": str(out)}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [json.loads((out / f"rank-{r}.json").read_text()) for r in range(nproc)]


def replay_max_per_chunk(pp: int, rank: int, chunks: int, micro: int) -> list[int]:
    live, best = [0] * chunks, [0] * chunks
    for kind, _, chunk in schedule.events(pp, rank, chunks, micro):
        live[chunk] += 1 if kind == "F" else -1
        best[chunk] = max(best[chunk], live[chunk])
    return best


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_plan_matches_real_ranks(name, tmp_path):
    nproc, overrides, config = (*LAYOUTS[name], CONFIG)[:3]
    if config == GLM5 and not megatron_core.is_019():
        pytest.skip("GLM-5's DSA modules are megatron-core 0.19's")
    cfg = load_config(config, BASE + overrides)
    plan = make_plan(cfg, nproc, parse_gpu("h100"), cpu=True)
    vocab = resolve_vocab(cfg)
    for rec in run(nproc, overrides, tmp_path, config):
        where = f"{name} rank {rec['rank']}"
        pp = rec["pp_rank"]
        want = state_bytes(cfg, plan.sizes, pp, plan.target, vocab, rec["dp_rank"], rec["edp_rank"])
        got = rec["state"]
        assert (got["params"], got["grads"], got["optimizer"]) == (want.params, want.grads, want.optimizer), where
        assert rec["num_micro"] == plan.num_micro
        if name in FROZEN:
            _check_frozen(plan, rec, where)
        else:
            flight = rec["in_flight"]
            assert flight["peak"] == plan.ranks[pp].in_flight == schedule.max_in_flight(
                plan.sizes.pp, pp, plan.sizes.vpp, plan.num_micro), (where, flight)
            assert flight["max_per_chunk"] == replay_max_per_chunk(plan.sizes.pp, pp, plan.sizes.vpp, plan.num_micro)
        measured = collections.Counter()
        for key, nbytes in rec["comm"].items():
            measured[key.split(":")[0]] += nbytes
        predicted = comm.step_bytes(cfg, plan, pp)
        for kind in set(MODELED) & (set(measured) | set(predicted)):
            ratio = predicted[kind] / measured[kind] if measured[kind] else float("inf")
            print(where, kind, measured[kind], round(ratio, 4))
            assert abs(ratio - 1) < 0.10, (where, kind, predicted[kind], measured[kind])
        unmodeled = sum(v for k, v in measured.items() if k not in MODELED)
        assert unmodeled <= 0.01 * sum(measured.values()), (where, measured)
        if rec["saved"] is not None:
            ratio = plan.ranks[pp].chunk_bytes[0] / rec["saved"]
            print(where, "saved activations", rec["saved"], round(ratio, 4))
            assert abs(ratio - 1) < 0.10, (where, rec["saved"], plan.ranks[pp].chunk_bytes)


def _check_frozen(plan, rec, where):
    """MTP-only training: no gradients where no MTP layer is, one micro-batch's MTP graph in flight (state,
    communication and saved activations: as for every layout)."""
    pp = rec["pp_rank"]
    holds_mtp = any(st.mtp_layers for st in model_stages(plan.cfg) if st.pp_rank == pp)
    assert (rec["state"]["grads"] > 0) == holds_mtp, where
    assert plan.ranks[pp].in_flight == int(holds_mtp), where
    # a stage without an MTP layer runs no backward at all; the MTP stage one per micro-batch
    assert rec["backward_calls"] == (plan.num_micro if holds_mtp else 0), (where, rec["backward_calls"])
