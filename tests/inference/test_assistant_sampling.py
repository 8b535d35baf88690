"""Decoding with a Gemma 4 assistant drafter keeps the target's distribution: sampled speculatively (K = 2,
sixteen sequences per batch, each accepting its own number of drafts), the first three tokens follow the
target's exact joint distribution (chi-square, as for the other drafters); greedy batched decoding of prompts of
different lengths equals plain greedy decoding. Both models are built by transformers at random (8 tokens,
so that top-3 sampling has 27 cells of three tokens) and read from their saved directories, as a released
target and assistant would be."""

from __future__ import annotations

import pytest
import torch
from target_joint import batched_sampling_pvalue

transformers = pytest.importorskip("transformers")

TEXT = dict(vocab_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16, global_head_dim=16, num_global_key_value_heads=1,
            attention_k_eq_v=True, sliding_window=4, final_logit_softcapping=30.0, enable_moe_block=False,
            hidden_size_per_layer_input=0, layer_types=["sliding_attention", "full_attention"], bos_token_id=0,
            eos_token_id=1, pad_token_id=0,
            rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                             "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 1000000.0}})
PARAMS = {"temperature": 1.3, "top_k": 3}
SAMPLES = 900
PROMPT = [2, 5, 3, 1, 6]


def _randomized(model, std: float):
    with torch.no_grad():
        for param in model.parameters():
            if param.dim() > 1:
                param.normal_(0, std)
    return model


@pytest.fixture(scope="module")
def gen(tmp_path_factory):
    from megatron_mtp.inference.generate import load_generator

    root = tmp_path_factory.mktemp("assistant_sampling")
    torch.manual_seed(0)
    _randomized(transformers.Gemma4ForCausalLM(transformers.Gemma4TextConfig(**TEXT)), 0.3).save_pretrained(
        root / "target")
    text = dict(TEXT, hidden_size=16, intermediate_size=32, num_kv_shared_layers=2, vocab_size_per_layer_input=0)
    assistant = transformers.Gemma4AssistantForCausalLM(transformers.Gemma4AssistantConfig(
        text_config=text, backbone_hidden_size=TEXT["hidden_size"]))
    _randomized(assistant, 0.3).save_pretrained(root / "assistant")
    return load_generator(root / "target", assistant=root / "assistant")


def test_batched_speculative_sampling_with_an_assistant_keeps_the_target_distribution(gen):
    batch, pvalue = batched_sampling_pvalue(gen, PROMPT, PARAMS, SAMPLES)
    # both branches of the acceptance rule (0.13 of the drafts accepted, measured)
    assert 0.05 < batch.stats.acceptance_rate < 0.95 and batch.stats.verify_forwards >= SAMPLES // 16
    assert pvalue > 1e-3, f"chi-square p-value {pvalue}"


def test_batched_greedy_with_an_assistant_equals_plain_greedy(gen):
    prompts = [PROMPT, [3], [4, 4, 2, 7, 1, 5, 6, 2, 3, 3, 5, 2]]  # windows of 4 shorter than the longest
    plain = [gen.generate(p, max_new_tokens=12, ignore_eos=True).tokens for p in prompts]
    batch = gen.generate_batch(prompts, batch_size=3, max_new_tokens=12, speculative_k=3, ignore_eos=True)
    assert [r.tokens for r in batch.results] == plain and batch.stats.verify_forwards > 0
