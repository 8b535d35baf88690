"""`plan --speculative`: the bytes a decoding forward reads, the experts it touches, the predicted gain."""

from __future__ import annotations

import random
import subprocess
import sys
from pathlib import Path

import pytest

from megatron_mtp.config import load_config
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.config.vocab import resolve_vocab
from megatron_mtp.models.deepseek_v3.sizes import parameter_counts
from megatron_mtp.models.expert_reach import distinct_experts
from megatron_mtp.plan.speculative import (
    ServeLayout,
    assistant_step_bytes,
    draft_step_bytes,
    main_forward_bytes,
    predict,
    tokens_per_round,
)
from megatron_mtp.platform.gpus import parse_gpu

ROOT = Path(__file__).resolve().parents[2]
V3 = str(ROOT / "configs" / "deepseek_v3_671b.yaml")
GEMMA_26B, GEMMA_31B = str(ROOT / "configs" / "gemma4_26b_a4b.yaml"), str(ROOT / "configs" / "gemma4_31b.yaml")
ASSISTANT = ["mtp.style=assistant", "mtp.freeze_base=true", "checkpoint.load=/a/target", "mtp.num_layers=6",
             "mtp.assistant.hidden_size=1024", "mtp.assistant.num_layers=4", "mtp.assistant.num_attention_heads=16",
             "mtp.assistant.ffn_hidden_size=4096"]


@pytest.mark.parametrize("experts,topk,tokens", [(256, 8, 1), (256, 8, 4), (256, 8, 16), (8, 2, 3), (64, 6, 40)])
def test_distinct_experts_is_the_expected_count_of_uniform_topk_routing(experts, topk, tokens):
    rng = random.Random(0)
    trials = 4000
    seen = sum(len({e for _ in range(tokens) for e in rng.sample(range(experts), topk)}) for _ in range(trials))
    assert abs(seen / trials - distinct_experts(experts, topk, tokens)) < 0.02 * experts ** 0.5


def test_a_forward_that_touches_every_expert_reads_every_weight_but_the_embedding():
    """The bytes are the parameter bytes the family's counts give: the main model without its
    embedding table (a forward reads only its tokens' rows), and the MTP module plus the head."""
    cfg = load_config(V3)
    vocab = resolve_vocab(cfg)
    counts = parameter_counts(cfg, vocab)
    serve = ServeLayout(weight_bytes=1.0)
    main = main_forward_bytes(cfg, vocab, batch=1, tokens=1, serve=serve, experts_touched=cfg.model.num_experts)
    assert main.dense + main.experts == counts["main"] - vocab * cfg.model.hidden_size
    draft = draft_step_bytes(cfg, vocab, batch=10**6, serve=serve)
    assert draft.dense + draft.experts == pytest.approx(counts["mtp_unique"] + vocab * cfg.model.hidden_size, rel=1e-9)
    # split over the serving layout
    split = main_forward_bytes(cfg, vocab, 1, 1, ServeLayout(tp=8, ep=8, weight_bytes=2.0), cfg.model.num_experts)
    assert split.dense + split.experts == pytest.approx(2 * (main.dense + main.experts) / 8)
    assert split.kv == pytest.approx(main.kv / 8) and main.kv == 4096 * 61 * (512 + 64) * 2  # bf16 MLA latents


def test_tokens_per_round_follows_the_chain_of_acceptances():
    a = 0.8
    for k in (1, 2, 3):
        assert tokens_per_round([a], k) == pytest.approx((1 - a ** (k + 1)) / (1 - a))  # Leviathan et al.
    assert tokens_per_round([0.9, 0.5], 3) == pytest.approx(1 + 0.9 + 0.45 + 0.225)


def test_moe_verification_touches_more_experts_and_the_gain_returns_with_the_batch():
    cfg = load_config(V3)
    rows = {(r.batch, r.drafts): r for r in predict(cfg, resolve_vocab(cfg), parse_gpu("h200"), [0.85],
                                                     ServeLayout(tp=8, ep=8))}
    assert rows[(1, 1)].verify_experts > rows[(1, 1)].plain_experts
    assert rows[(256, 3)].speedup > rows[(4, 3)].speedup > 1.0
    assert all(r.round_ms > r.plain_ms for r in rows.values())


def test_an_assistant_step_reads_its_weights_and_the_stored_keys_of_its_kinds():
    """Gemma 4's assistant (the 31B's shape of configs/gemma4_31b.yaml): all its weights (its 262,144 × 1,024 output
    table the bulk), and per layer the target's stored keys/values of that layer's kind for every sequence (a
    sliding layer: its window, keys and values; a full layer: keys alone, its values are its keys), no expert."""
    cfg = load_config(GEMMA_31B, ["checkpoint.load=/a/target"])
    vocab, context = resolve_vocab(cfg), 8192
    step = assistant_step_bytes(cfg, vocab, batch=4, serve=ServeLayout(weight_bytes=2.0, context=context))
    h = 1024
    layer = lambda q: 4 * h + q * h * 2 + 2 * h * 4096 + 4096 * h + 256  # noqa: E731  norms, q, o, MLP, q norm
    weights = (2 * 5376 * h + 3 * layer(16 * 256) + layer(16 * 512) + 256 + h + 5376 * h + vocab * h)
    assert step.dense == pytest.approx(2 * weights, rel=1e-3) and step.experts == 0
    sliding, full = 2 * 16 * 256 * 1024, 4 * 512 * context  # three sliding layers read the window, one full layer
    assert step.kv == 4 * (3 * sliding + full) * 2


def test_expert_loading_takes_the_assistants_gain_at_small_batches():
    """The same assistant drafting for the 26B-A4B MoE target and for the dense 31B: verifying K + 1 tokens per
    sequence loads experts plain decoding does not, so at batch 1 the MoE target's gain is a fraction of the dense
    one's; by batch 64 every expert is loaded either way and the gains meet (the README's prediction)."""
    gains = {}
    for name, config in (("moe", GEMMA_26B), ("dense", GEMMA_31B)):
        cfg = load_config(config, ASSISTANT)
        rows = predict(cfg, resolve_vocab(cfg), parse_gpu("h100"), [0.8], ServeLayout(weight_bytes=2.0),
                       batches=(1, 4, 16, 64), drafts=(6,))
        gains[name] = {r.batch: r.speedup for r in rows}
    assert gains["moe"][1] < 0.5 * gains["dense"][1] and gains["dense"][1] > 3.0
    assert gains["moe"][1] < gains["moe"][16] < gains["moe"][64]
    assert abs(gains["moe"][64] / gains["dense"][64] - 1) < 0.1


def test_an_eagle3_step_reads_its_layers_its_draft_head_and_its_own_keys():
    """An EAGLE-3 drafter for DeepSeek-V3 (one Llama layer of the target's width, 32,000 draft tokens, 8 key/value
    heads): a step reads its layer, its final norm, its head over the draft vocabulary and a third of fc (one run
    per round of 3 steps), its own keys and values over the context, no expert; the prediction drafts with it."""
    cfg = load_config(V3, ["mtp.style=eagle3", "checkpoint.load=/a/target", "mtp.num_layers=3",
                           "mtp.eagle3.draft_vocab_size=32000", "mtp.eagle3.num_query_groups=8",
                           "mtp.eagle3.ffn_hidden_size=14336"])
    vocab, context = resolve_vocab(cfg), 4096
    step = get_style("eagle3").plan().draft_step_bytes(cfg, vocab, batch=4, serve=ServeLayout(weight_bytes=2.0,
                                                                                                context=context))
    h, heads, head_dim = 7168, 128, 7168 // 128
    q, kv = heads * head_dim, 8 * head_dim
    layer = 2 * h * (q + 2 * kv) + q * h + 3 * h * 14336 + 3 * h  # q/k/v of [embedding ; hidden], o, MLP, norms
    assert step.dense == pytest.approx(2 * (layer + h + 32000 * h + 3 * h * h / 3)) and step.experts == 0
    assert step.kv == 4 * context * 2 * kv * 2
    rows = predict(cfg, vocab, parse_gpu("h200"), [0.8], ServeLayout(tp=8, ep=8), batches=(1,), drafts=(3,))
    assert rows[0].speedup > 1.0


@pytest.mark.parametrize("args,words", [
    (["--acceptance", "x"], "--acceptance 'x' must be rates"),
    (["--acceptance", "1.5"], "must be rates between 0 and 1"),
    (["--serve-tp", "0"], "--serve-tp is 0"),
    (["mtp.num_layers=0"], "needs a drafter; set mtp.num_layers ≥ 1 with mtp.style="),
    (["--gpu", "96"], "bandwidth of '96 GiB GPU' is unknown"),
    (["--serve-ep", "100000"], "--serve-ep 100000 does not divide the model's 256 routed experts"),
])
def test_bad_input_is_one_sentence(args, words):
    proc = subprocess.run([sys.executable, "-m", "megatron_mtp", "plan", V3, "--speculative", *args],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 2 and words in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr


@pytest.mark.parametrize("config, tp, ep, words", [
    ("deepseek_v3_671b", 1, 3, "--serve-ep 3 does not divide the model's 256 routed experts"),
    ("deepseek_v3_671b", 1, 1000, "--serve-ep 1000 does not divide"),
    ("deepseek_v3_671b", 256, 1, "--serve-tp 256 does not divide the model's 128 attention heads"),
    ("glm4_5", 3, 1, "--serve-tp 3 neither divides the model's 8 key/value heads nor is a multiple of them"),
    ("glm4_5", 1, 160, None), ("glm4_5", 16, 8, None), ("glm4_5", 4, 1, None),
])
def test_a_serving_layout_an_engine_cannot_build_is_one_sentence(config, tp, ep, words):
    from megatron_mtp.config import load_config
    from megatron_mtp.errors import UserError
    from megatron_mtp.plan.speculative import ServeLayout, check_serve_layout

    cfg = load_config(str(ROOT / "configs" / f"{config}.yaml"))
    if words is None:
        check_serve_layout(cfg, ServeLayout(tp=tp, ep=ep))
        return
    with pytest.raises(UserError, match=words):
        check_serve_layout(cfg, ServeLayout(tp=tp, ep=ep))
