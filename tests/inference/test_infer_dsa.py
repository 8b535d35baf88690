"""The DSA families (DeepSeek-V3.2: DeepseekV32ForCausalLM; GLM-5: GlmMoeDsaForCausalLM, its layer 1 reusing layer 0's
top-k) against transformers 5, fp32: a random tiny model transformers built, index_topk 4 below every length
here, so the lightning indexer decides what each query reads. Our logits equal transformers' full forward, which
equals transformers' own incremental decoding (prefill, then token by token: checked first); ours incrementally
too, a rejected chunk rolled back between. The MTP layer (its own indexer) equals transformers' decoder layer driven
by megatron-core's MTP recipe (transformers 5.25's MtpModel does not take the DSA configs), at once and
incrementally. Speculative greedy with it, K = 1..3 on a batch of two prompts of different lengths, equals plain
greedy."""

from __future__ import annotations

import pytest
import torch
from infer_tiny_model import hf_model_class, make_tiny_export

pytest.importorskip("transformers.models.glm_moe_dsa")

FAMILIES = ["deepseek_v32", "glm_moe_dsa"]
TOL = 1e-4


@pytest.fixture(scope="module", params=FAMILIES)
def dsa(request, tmp_path_factory):
    """(family, transformers' model, our generator): inline layout with one MTP layer, near-bigram weights (drafts
    partly accepted)."""
    from megatron_mtp.inference.generate import load_generator

    family = request.param
    root = make_tiny_export(tmp_path_factory.mktemp(family), layout="inline", mtp_depth=1, seed=3, family=family,
                            near_bigram=0.05)
    hf = hf_model_class(family).from_pretrained(root, dtype=torch.float32, attn_implementation="eager").eval()
    return family, hf, load_generator(root)


def _indexers(gen):
    return [layer.self_attn.indexer for layer in gen.target.model.layers]


def test_logits_match_transformers_prefill_then_token_by_token(dsa, monkeypatch):
    from megatron_mtp.models.dsa.decoder import Indexer

    family, hf, gen = dsa
    indexers = _indexers(gen)
    if family == "glm_moe_dsa":  # IndexShare: layer 1 has no indexer, no indexer key cache
        assert indexers[1] is None and "index_k" not in gen.target.model.layers[1].new_cache(torch.float32).dims
    ids = list(range(5, 40, 2))
    assert max(i.topk for i in indexers if i is not None) == 4 < len(ids)
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0]
        out = hf(torch.tensor([ids[:7]]), use_cache=True)
        theirs = [out.logits[0]]
        for token in ids[7:]:
            out = hf(torch.tensor([[token]]), cache=out.past_key_values, use_cache=True)
            theirs.append(out.logits[0])
    assert (torch.cat(theirs) - ref).abs().max() < TOL  # transformers' incremental DSA is its full forward
    target = gen.target
    target.reset_cache()
    assert (target.forward(ids)[0] - ref).abs().max() < TOL
    monkeypatch.setattr(Indexer, "SCORE_ELEMENTS", 5 * 16 * len(ids))  # the prefill's queries scored 5 at a time
    target.reset_cache()
    assert (target.forward(ids)[0] - ref).abs().max() < TOL
    monkeypatch.undo()
    target.reset_cache()  # prefill, a rejected chunk rolled back, then token by token
    ours = [target.forward(ids[:7])[0]]
    target.forward([3, 4, 5])
    target.truncate_cache(7)
    ours += [target.forward([token])[0] for token in ids[7:]]
    assert (torch.cat(ours) - ref).abs().max() < TOL
    for indexer in indexers:  # every key read: the logits change, so the top-k above decided them
        if indexer is not None:
            indexer.topk = len(ids)
    try:
        target.reset_cache()
        assert (target.forward(ids)[0] - ref).abs().max() > 1e-3
    finally:
        for indexer in indexers:
            if indexer is not None:
                indexer.topk = 4


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def test_mtp_layer_matches_transformers_layer_by_megatron_recipe(dsa):
    """h(t) = shared_head.norm(layer(eh_proj([enorm(emb(x_{t+1})); hnorm(h_0(t))]))) with transformers' own decoder
    layer class (an MoE layer with an indexer) holding the MTP layer's weights."""
    family, hf, gen = dsa
    module = gen.drafter.modules[0]
    assert module.self_attn.indexer is not None and "index_k" in module.new_cache(torch.float32).dims
    layers = hf.config.num_hidden_layers
    layer = type(hf.model.layers[-1])(hf.config, layers - 1).eval()
    ours = module.state_dict()
    layer.load_state_dict({k: ours[k] for k in layer.state_dict()}, strict=True)
    ids, eps = list(range(10, 60, 3)), hf.config.rms_norm_eps
    with torch.no_grad():
        h0 = hf.model(torch.tensor([ids])).last_hidden_state[0, :-1]
        e = hf.model.embed_tokens(torch.tensor(ids[1:]))
        x = module.eh_proj(torch.cat([_rms(e, ours["enorm.weight"], eps), _rms(h0, ours["hnorm.weight"], eps)], -1))
        t = x.shape[0]
        positions = torch.arange(t)[None]
        out = layer(x[None], attention_mask=torch.full((t, t), float("-inf")).triu(1)[None, None],
                    position_embeddings=hf.model.rotary_emb(x[None], positions), position_ids=positions, cache=None)
        ref = _rms((out[0] if isinstance(out, tuple) else out)[0], ours["shared_head.norm.weight"], eps)
    gen.target.reset_cache()
    hidden = gen.target.forward(ids)[1][:-1]
    module.reset_cache()
    assert (module.step(hidden, ids[1:], 0)[0] - ref).abs().max() < TOL
    module.reset_cache()  # incrementally, as drafting runs it
    steps = [module.step(hidden[:6], ids[1:7], 0)[0], module.step(hidden[6:7], ids[7:8], 6)[0],
             module.step(hidden[7:], ids[8:], 7)[0]]
    assert (torch.cat(steps) - ref).abs().max() < TOL
    module.self_attn.indexer.topk = t  # every key read: the output changes, so the MTP layer's top-k decided it
    try:
        module.reset_cache()
        assert (module.step(hidden, ids[1:], 0)[0] - ref).abs().max() > 1e-3
    finally:
        module.self_attn.indexer.topk = 4


def test_speculative_greedy_with_the_mtp_layer_equals_plain_greedy(dsa):
    family, _, gen = dsa
    prompts = [[7, 30, 12, 99, 5, 61, 8], [44, 3, 17, 250, 90, 11, 6, 73, 120, 15, 2, 38, 64]]
    plain = [r.tokens for r in gen.generate_batch(prompts, max_new_tokens=14, ignore_eos=True, batch_size=2).results]
    for k in (1, 2, 3):
        batch = gen.generate_batch(prompts, max_new_tokens=14, ignore_eos=True, batch_size=2, speculative_k=k)
        assert [r.tokens for r in batch.results] == plain, k
        rates = [r.stats.acceptance_rate for r in batch.results]
        assert 0.0 < sum(rates) / 2 < 1.0, rates  # drafts accepted and rejected: rollback of both caches ran
