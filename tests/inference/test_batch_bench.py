"""tools/bench/bench_batched_decode.py: a smoke run; and the bytes model of plan/speculative.py (which
`plan --speculative` and the bench predict with) against the parameters of the decoder that runs: a
forward reads every weight of the layers it runs but the embedding table, and the routed experts it
touches."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from megatron_mtp.config import load_config
from megatron_mtp.config.vocab import resolve_vocab
from megatron_mtp.inference.mtp_module import mtp_module
from megatron_mtp.inference.target import TargetModel
from megatron_mtp.models.decoding.layers import MoE
from megatron_mtp.models.deepseek_v3.hf_config import to_hf_config
from megatron_mtp.models.expert_reach import distinct_experts
from megatron_mtp.plan.speculative import ServeLayout, draft_step_bytes, main_forward_bytes

DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "tiny_cpu.yaml"


def _routed(module: torch.nn.Module) -> int:
    return sum(p.numel() for m in module.modules() if isinstance(m, MoE) for p in m.experts.parameters())


@pytest.mark.parametrize("touched", [2.0, 5.5, 8.0])
def test_forward_bytes_are_the_parameter_bytes_of_the_layers_and_experts_counted(touched):
    cfg = load_config(str(DEFAULT))
    vocab = resolve_vocab(cfg)
    hf = to_hf_config(cfg.model, cfg.mtp, vocab_size=vocab, num_nextn_predict_layers=1)
    with torch.device("meta"):
        target = TargetModel(hf)
        module = mtp_module(hf, hf.num_hidden_layers, own_embedding=False, own_head=False)
    moe = [m for m in target.modules() if isinstance(m, MoE)]
    expert = moe[0].expert_params()
    serve = ServeLayout(weight_bytes=2.0, kv_bytes=2.0, context=100)
    forward = main_forward_bytes(cfg, vocab, batch=4, tokens=12, serve=serve, experts_touched=touched)
    dense = sum(p.numel() for p in target.parameters()) - _routed(target) - target.model.embed_tokens.weight.numel()
    assert forward.dense == 2.0 * dense
    assert forward.experts == pytest.approx(2.0 * len(moe) * touched * expert)
    assert forward.kv == 4 * 100 * hf.num_hidden_layers * (hf.kv_lora_rank + hf.qk_rope_head_dim) * 2.0
    draft = draft_step_bytes(cfg, vocab, batch=4, serve=serve)
    own = sum(p.numel() for p in module.parameters()) - _routed(module)
    assert draft.dense == 2.0 * (own + vocab * hf.hidden_size)  # the module, and the main model's head
    uniform = distinct_experts(hf.n_routed_experts, hf.num_experts_per_tok, 4)
    assert draft.experts == pytest.approx(2.0 * uniform * expert)


def test_batched_bench_smoke(export_d1, tmp_path, capsys):
    import importlib.util
    import json

    path = Path(__file__).resolve().parents[2] / "tools" / "bench" / "bench_batched_decode.py"
    spec = importlib.util.spec_from_file_location("bench_batched_decode", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = tmp_path / "bench.json"
    assert bench.main([str(export_d1), "--batches", "1,3", "--ks", "1,2", "--prompts", "3", "--max-new-tokens", "5",
                       "--repeats", "1", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [(r["batch"], r["k"]) for r in rows] == [(1, 1), (1, 2), (3, 1), (3, 2)]
    assert all(r["identical"] and r["verify_experts"] >= r["plain_experts"] > 0 and r["predicted_bytes"] > 0
               for r in rows)
    assert "pred(bytes)" in capsys.readouterr().out
    assert bench.main([str(export_d1), "--batches", "0"]) == 2
