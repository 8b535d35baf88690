"""Speculative decoding with parallel-head drafts: greedy equals plain greedy, sampling keeps the
target distribution (chi-square, a K=2 round whose drafts come from two independent heads), K <= n."""

from __future__ import annotations

import json

import pytest
import torch
from infer_tiny_model import make_tiny_export, tiny_config
from safetensors.torch import load_file, save_file
from target_joint import batched_sampling_pvalue, exact_joint, joint_pvalue

from megatron_mtp.errors import UserError
from megatron_mtp.inference.sampling import SamplingParams, probabilities
from megatron_mtp.mtp_styles.parallel.hf_format import heads_config

PROMPT = "def add(a, b):\n    return"
HEADS = 3


def make_heads_export(root, heads: int = HEADS, seed: int = 0, std: float = 0.08, vocab: int | None = None):
    """A tiny main/ (transformers' random DeepseekV3ForCausalLM) and mtp/ with random parallel heads;
    with ``vocab``, a model of that many tokens and no tokenizer (prompts are token ids)."""
    main_dir = root / "main"
    if vocab is None:
        make_tiny_export(root / "main_only", layout="plain", seed=seed)
        (root / "main_only").rename(main_dir)
    else:
        from transformers import DeepseekV3ForCausalLM

        torch.manual_seed(seed)
        DeepseekV3ForCausalLM(tiny_config(vocab=vocab)).eval().save_pretrained(main_dir)
    state = {}
    for file in main_dir.glob("*.safetensors"):
        state.update(load_file(str(file)))
    config = json.loads((main_dir / "config.json").read_text())
    last = f"model.layers.{config['num_hidden_layers'] - 1}."
    gen = torch.Generator().manual_seed(seed + 7)
    out = {}
    for i in range(heads):
        for name, tensor in state.items():
            if not name.startswith(last):
                continue
            rest = name[len(last):]
            if rest.endswith("layernorm.weight"):
                value = 1.0 + 0.1 * torch.randn(tensor.shape, generator=gen)
            elif rest.endswith("e_score_correction_bias"):
                value = torch.zeros(tensor.shape)
            else:
                value = std * torch.randn(tensor.shape, generator=gen)
            out[f"heads.{i}.{rest}"] = value.contiguous()
        out[f"heads.{i}.norm.weight"] = 1.0 + 0.1 * torch.randn(config["hidden_size"], generator=gen)
    mtp_dir = root / "mtp"
    mtp_dir.mkdir()
    save_file(out, str(mtp_dir / "model.safetensors"))
    (mtp_dir / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: "model.safetensors" for k in sorted(out)}}))
    (mtp_dir / "config.json").write_text(json.dumps(heads_config(config, heads), indent=2))
    return root


@pytest.fixture(scope="module")
def gen_heads(tmp_path_factory):
    from megatron_mtp.inference.generate import load_generator
    from megatron_mtp.mtp_styles.parallel.drafter import ParallelHeadsDrafter

    gen = load_generator(make_heads_export(tmp_path_factory.mktemp("heads")))
    assert isinstance(gen.drafter, ParallelHeadsDrafter) and gen.drafter.depth == HEADS
    return gen


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_speculative_equals_plain(gen_heads, k):
    plain = gen_heads.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
    spec = gen_heads.generate(PROMPT, max_new_tokens=40, ignore_eos=True, speculative_k=k)
    assert spec.tokens == plain.tokens
    assert spec.stats.rounds > 0 and len(spec.stats.acceptance_per_position) == k


def test_more_drafts_than_heads_is_one_sentence(gen_heads):
    with pytest.raises(UserError, match=r"more draft tokens than the 3 parallel MTP heads .* use K <= 3"):
        gen_heads.generate(PROMPT, max_new_tokens=8, speculative_k=4)


def test_heads_draft_from_the_target_hidden_state_alone(gen_heads):
    """Head k at the last known position equals the head run from scratch over the target's hidden states
    (the caches kept across rounds are exact), and different heads draft different distributions."""
    drafter, target = gen_heads.drafter, gen_heads.target
    result = gen_heads.generate(PROMPT, max_new_tokens=20, ignore_eos=True, speculative_k=3)
    tokens = gen_heads.encode(PROMPT) + result.tokens
    kept = drafter.cache_lengths()
    assert min(kept) > len(gen_heads.encode(PROMPT))
    target.reset_cache()
    _, hidden = target.forward(tokens[:-1])
    logits = []
    with torch.inference_mode():
        for head, length in zip(drafter.heads, kept):
            incremental = head.cache
            head.reset_cache()
            out = head.step(hidden, 0)
            assert torch.allclose(head.cache.read("latent")[:length], incremental.read("latent")[:length], atol=1e-5)
            logits.append(drafter.lm_head(out[-1]))
    assert (logits[0] - logits[1]).abs().max() > 1e-3


PARAMS = {"temperature": 1.3, "top_k": 3}
SAMPLES = 900


@pytest.fixture(scope="module")
def gen_small_vocab(tmp_path_factory):
    """8 tokens and heads far from the target (std 0.3): sampling both accepts and rejects about half the drafts
    (0.53 measured), with 27 cells of three tokens under top-k 3."""
    from megatron_mtp.inference.generate import load_generator

    return load_generator(make_heads_export(tmp_path_factory.mktemp("small"), std=0.3, vocab=8))


def test_speculative_sampling_matches_target_distribution(gen_small_vocab):
    """4 new tokens with K=2: after the prefill's token a round drafts two tokens from heads 1 and 2
    (independent draws); the first three tokens must follow the target's joint distribution."""
    gen = gen_small_vocab
    prompt_ids = [2, 5, 3, 1, 6]
    joint = exact_joint(gen, prompt_ids, SamplingParams(**PARAMS), depth=3)
    counts, accepted, judged = {}, 0, 0
    for seed in range(SAMPLES):
        result = gen.generate(prompt_ids, max_new_tokens=4, seed=seed, speculative_k=2, ignore_eos=True, **PARAMS)
        key = tuple(result.tokens[:3])
        counts[key] = counts.get(key, 0) + 1
        accepted += sum(result.stats.accepted)
        judged += sum(result.stats.reached)
    assert 0.2 < accepted / judged < 0.8  # both branches of the acceptance rule are exercised
    assert set(counts) <= set(joint), "emitted a sequence the target gives probability 0"
    pvalue = joint_pvalue(counts, joint)
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_the_chi_square_test_sees_a_lossy_rule(gen_small_vocab, monkeypatch):
    """Guard: a lossy rule (accept every draft the target's top-k allows, i.e. emit the draft distribution
    there) fails the same test."""
    import megatron_mtp.inference.batch_generate as batch_module

    def accept_in_support(target_logits, drafts, dists, params, generator):
        p_rows = probabilities(target_logits, params)
        for i, token in enumerate(drafts):
            if p_rows[i][token] == 0:
                return i, int(torch.multinomial(p_rows[i], 1, generator=generator))
        return len(drafts), int(torch.multinomial(p_rows[len(drafts)], 1, generator=generator))

    monkeypatch.setattr(batch_module, "verify", accept_in_support)
    gen = gen_small_vocab
    prompt_ids = [2, 5, 3, 1, 6]
    joint = exact_joint(gen, prompt_ids, SamplingParams(**PARAMS), depth=3)
    counts = {}
    for seed in range(SAMPLES):
        key = tuple(gen.generate(prompt_ids, max_new_tokens=4, seed=seed, speculative_k=2, ignore_eos=True,
                                 **PARAMS).tokens[:3])
        counts[key] = counts.get(key, 0) + 1
    assert joint_pvalue(counts, joint) < 1e-3


def test_batched_speculative_sampling_matches_target_distribution(gen_small_vocab):
    """The same test with the copies decoded 16 at a time: each round drafts from both heads for 16
    sequences in one forward per head and verifies them in one target forward."""
    gen = gen_small_vocab
    prompt_ids = [2, 5, 3, 1, 6]
    batch, pvalue = batched_sampling_pvalue(gen, prompt_ids, PARAMS, SAMPLES)
    assert 0.2 < batch.stats.acceptance_rate < 0.8 and batch.stats.verify_forwards >= SAMPLES // 16
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"
