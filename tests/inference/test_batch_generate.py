"""Batched generation: every sequence equals its prompt decoded alone with plain greedy (prompts of 1..200
tokens, EOS and token limits in mid-batch, continuous batching, both MTP styles, DeepSeek-V3's MLA and
GLM-4.5's grouped-query attention), and after every round each slot's caches equal a fresh prefill of
its committed tokens."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from test_parallel_draft import make_heads_export

LENGTHS = [1, 2, 3, 5, 9, 17, 31, 50, 77, 101, 133, 160, 181, 200]


def _prompts(vocab: int, seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, vocab, (n,), generator=gen).tolist() for n in LENGTHS]


def _budgets() -> list[int]:
    return [5 + (7 * i) % 13 for i in range(len(LENGTHS))]  # 5..17, different limits in mid-batch


class _OracleDrafts:
    """The model's own batched drafter (its caches see every draft), but each draft is the plain-greedy
    continuation, wrong where a fixed pattern says so: sequences accept different numbers of drafts per
    round (0..K). With ``snapshot``, records every slot's caches after each rollback."""

    def __init__(self, inner, target, fulls: list[list[int]], vocab: int, snapshot: bool = False) -> None:
        self.inner, self.target, self.fulls, self.vocab, self.snapshot = inner, target, fulls, vocab, snapshot
        self.snapshots: list[tuple[list[int], list[dict], list[dict]]] = []
        self.slot_full: dict[int, list[int]] = {}

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def _full(self, seq):
        return next(f for f in self.fulls if f[: len(seq)] == seq)

    def propose_rows(self, slots, seqs, ks, picks):
        def oracle(full, n, j):
            def pick(logits):
                j[0] += 1
                token = full[n - 1 + j[0]] if n - 1 + j[0] < len(full) else 0
                wrong = (n * 5 + j[0] * 3) % 7 == 0
                return ((token + 1) % self.vocab if wrong else token), None
            return pick

        for slot, seq in zip(slots, seqs):
            self.slot_full[slot] = self._full(seq)
        return self.inner.propose_rows(slots, seqs, ks, [oracle(self._full(s), len(s), [0]) for s in seqs])

    def rollback_rows(self, slots, committed):
        self.inner.rollback_rows(slots, committed)
        if not self.snapshot:
            return
        for slot, n in zip(slots, committed):
            seq = self.slot_full[slot][:n]
            target = [{name: cache.buffers[name][slot, : cache.lengths[slot]].clone() for name in cache.buffers}
                      for cache in self.target.caches]
            modules = [{name: m.cache.buffers[name][slot, : m.cache.lengths[slot]].clone() for name in m.cache.buffers}
                       for m in getattr(self.inner, "modules", getattr(self.inner, "heads", []))]
            self.snapshots.append((slot, n, target, modules, seq))


def _eos_config(gen, eos):
    gen.target.config = replace(gen.target.config, eos_token_id=eos)


def _check_equal_to_plain(gen, k, drafter_factory=None):
    prompts, budgets = _prompts(gen.config.vocab_size), _budgets()
    plain = [gen.generate(p, max_new_tokens=m, ignore_eos=True).tokens for p, m in zip(prompts, budgets)]
    eos = plain[3][2]  # a token some sequence emits early: EOS ends sequences in mid-batch
    original = gen.target.config
    try:
        _eos_config(gen, eos)
        reference = [gen.generate(p, max_new_tokens=m).tokens for p, m in zip(prompts, budgets)]
        drafter = drafter_factory([p + t for p, t in zip(prompts, plain)]) if drafter_factory else None
        batch = gen.generate_batch(prompts, batch_size=5, max_new_tokens=budgets, speculative_k=k, drafter=drafter)
    finally:
        gen.target.config = original
    assert [r.tokens for r in batch.results] == reference
    reasons = {r.stats.finish_reason for r in batch.results}
    assert reasons == {"eos", "length"}
    return batch


@pytest.mark.parametrize(("fixture", "k"), [("gen_d1", 0), ("gen_d1", 1), ("gen_d1", 3), ("gen_d2", 2), ("gen_glm", 2),
                                                ("gen_qwen3", 3)])
def test_batched_greedy_equals_each_prompt_alone(request, fixture, k):
    gen = request.getfixturevalue(fixture)
    batch = _check_equal_to_plain(gen, k)
    assert batch.stats.prefill_forwards > 1  # slots were refilled (continuous batching)
    assert (batch.stats.verify_forwards > 0) == (k > 0)
    # every sequence's times are those of the forwards it took part in (a batch of one is generate())
    assert all(r.stats.target_time_s > 0 and (r.stats.draft_target_time_ratio > 0) == (k > 0) for r in batch.results)


@pytest.mark.parametrize("fixture", ["gen_d1", "gen_d2"])
def test_mixed_acceptance_per_sequence(request, fixture):
    """Drafts that are right except where a pattern says: each sequence accepts its own count per round."""
    gen = request.getfixturevalue(fixture)
    batch = _check_equal_to_plain(
        gen, 3, lambda fulls: _OracleDrafts(gen.drafter, gen.target, fulls, gen.config.vocab_size))
    stats = batch.stats
    assert 0.3 < stats.acceptance_rate < 1.0 and stats.tokens_per_sequence_forward > 1.5
    assert len(set(stats.acceptance_per_sequence)) > 3


@pytest.fixture(scope="module")
def gen_heads_batch(tmp_path_factory):
    from megatron_mtp.inference.generate import load_generator

    return load_generator(make_heads_export(tmp_path_factory.mktemp("heads_batch")))


@pytest.mark.parametrize("oracle", [False, True], ids=["own-heads", "mixed-acceptance"])
def test_parallel_heads_batched_greedy_equals_plain(gen_heads_batch, oracle):
    gen = gen_heads_batch
    factory = (lambda fulls: _OracleDrafts(gen.drafter, gen.target, fulls, gen.config.vocab_size)) if oracle else None
    batch = _check_equal_to_plain(gen, 2, factory)
    if oracle:
        assert 0.3 < batch.stats.acceptance_rate < 1.0


def _fresh_caches(gen, seq, module_lengths):
    """Target caches of a fresh batch-1 prefill of seq[:-1] and the MTP modules (megatron's depth recipe)
    or heads run from scratch over it."""
    target = gen.target
    target.reset_cache()
    _, hidden = target.forward(seq[:-1])
    ref_target = [{name: cache.read(name).clone() for name in cache.buffers} for cache in target.caches]
    refs = []
    drafter = gen.drafter
    if hasattr(drafter, "heads"):
        for head, length in zip(drafter.heads, module_lengths):
            head.reset_cache()
            head.step(hidden, 0)
            refs.append({name: head.cache.read(name)[:length].clone() for name in head.cache.buffers})
        return ref_target, refs
    for m, (module, length) in enumerate(zip(drafter.modules, module_lengths), start=1):
        module.reset_cache()
        usable = len(seq) - 1 - m
        post, _, _ = module.step(hidden[:usable], seq[m : usable + m], 0)
        refs.append({name: module.cache.read(name)[:length].clone() for name in module.cache.buffers})
        hidden = post
    return ref_target, refs


@pytest.mark.parametrize("fixture", ["gen_d1", "gen_d2", "gen_heads_batch", "gen_glm", "gen_qwen3"])
def test_rollback_per_sequence_leaves_a_fresh_prefills_cache(request, fixture):
    gen = request.getfixturevalue(fixture)
    prompts, budgets = _prompts(gen.config.vocab_size, seed=1)[::2], [12] * 7
    fulls = [p + gen.generate(p, max_new_tokens=12, ignore_eos=True).tokens for p in prompts]
    oracle = _OracleDrafts(gen.drafter, gen.target, fulls, gen.config.vocab_size, snapshot=True)
    k = 2
    batch = gen.generate_batch(prompts, batch_size=3, max_new_tokens=budgets, speculative_k=k, ignore_eos=True,
                               drafter=oracle)
    assert [p + r.tokens for p, r in zip(prompts, batch.results)] == fulls
    assert 0.3 < batch.stats.acceptance_rate < 1.0
    checked = 0
    for slot, n, target, modules, seq in oracle.snapshots[::3]:
        # all committed tokens but the pending one (every buffer of a cache has the slot's length)
        assert all(len(buf) == n - 1 for layer in target for buf in layer.values())
        ref_target, refs = _fresh_caches(gen, seq, [len(next(iter(m.values()))) for m in modules])
        for ours, ref in zip(target + modules, ref_target + refs):
            for name in ref:
                assert torch.allclose(ours[name], ref[name], atol=2e-5), (slot, n, name)
        checked += 1
    assert checked >= 5
