"""Greedy speculative decoding is exact; a perfect draft is fully accepted; rollback and EOS."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from infer_tiny_model import TargetAsDraft

PROMPT = "def add(a, b):\n    return"


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("fixture", ["gen_d1", "gen_glm", "gen_qwen3"])
def test_greedy_speculative_equals_plain_d1(request, fixture, k):
    gen = request.getfixturevalue(fixture)
    plain = gen.generate(PROMPT, max_new_tokens=40, ignore_eos=True)
    spec = gen.generate(PROMPT, max_new_tokens=40, ignore_eos=True, speculative_k=k)
    assert spec.tokens == plain.tokens
    assert spec.text == plain.text
    assert spec.stats.rounds > 0 and len(spec.stats.acceptance_per_position) == k


@pytest.mark.parametrize("k", [1, 2, 3])
def test_greedy_speculative_equals_plain_d2(gen_d2, k):
    assert gen_d2.drafter.depth == 2
    plain = gen_d2.generate(PROMPT, max_new_tokens=30, ignore_eos=True)
    spec = gen_d2.generate(PROMPT, max_new_tokens=30, ignore_eos=True, speculative_k=k)
    assert spec.tokens == plain.tokens


@pytest.mark.parametrize("k", [1, 2, 3])
def test_perfect_draft_is_always_accepted(gen_d1, k):
    rounds = 6
    result = gen_d1.generate(PROMPT, max_new_tokens=1 + rounds * (k + 1), ignore_eos=True, speculative_k=k,
                             drafter=TargetAsDraft(gen_d1.target))
    stats = result.stats
    assert stats.rounds == rounds
    assert stats.acceptance_per_position == [1.0] * k
    assert stats.mean_accept_length == k + 1
    assert result.tokens == gen_d1.generate(PROMPT, max_new_tokens=len(result.tokens), ignore_eos=True).tokens


def test_perfect_draft_sampling_accepts_everything(gen_d1):
    result = gen_d1.generate(PROMPT, max_new_tokens=25, temperature=0.9, top_k=20, seed=5, ignore_eos=True,
                             speculative_k=3, drafter=TargetAsDraft(gen_d1.target))
    assert result.stats.acceptance_rate > 0.99


class _CorruptingDraft(TargetAsDraft):
    """Perfect drafts except at draft position ``bad`` (1-based): acceptance is exactly bad-1."""

    def __init__(self, target, bad: int, vocab: int) -> None:
        super().__init__(target)
        self.bad, self.vocab, self.target = bad, vocab, target
        self.log: list[tuple[int, int]] = []

    def propose_rows(self, slots, seqs, ks, picks):
        drafts, dists = super().propose_rows(slots, seqs, ks, picks)
        if self.bad <= ks[0]:
            drafts[0][self.bad - 1] = (drafts[0][self.bad - 1] + 1) % self.vocab
        return drafts, dists

    def rollback_rows(self, slots, committed):
        self.log.append((committed[0], self.target.slot_length(0)))
        super().rollback_rows(slots, committed)


@pytest.mark.parametrize("bad", [1, 2, 3])
def test_target_cache_rolls_back_to_accepted_prefix(gen_d1, bad):
    k = 3
    draft = _CorruptingDraft(gen_d1.target, bad, gen_d1.config.vocab_size)
    prompt = gen_d1.encode(PROMPT)
    result = gen_d1.generate(prompt, max_new_tokens=1 + 5 * bad, ignore_eos=True, speculative_k=k, drafter=draft)
    assert result.tokens == gen_d1.generate(prompt, max_new_tokens=1 + 5 * bad, ignore_eos=True).tokens
    committed = [c for c, _ in draft.log]
    assert all(cache == c - 1 for c, cache in draft.log)  # target holds every committed token but the pending one
    first = len(prompt) + 1
    assert committed == [first + bad * (i + 1) for i in range(len(committed))]  # bad-1 accepted + 1 per round
    assert result.stats.acceptance_per_position[: bad - 1] == [1.0] * (bad - 1)
    assert result.stats.acceptance_per_position[bad - 1] == 0.0


def _reference_mtp_caches(gen, tokens, lengths):
    """Fresh MTP modules run over the committed tokens from scratch (megatron's depth recipe):
    module m at position t reads h_{m-1}(t) and token t+m. Returns each module's first ``length`` cache
    entries, every buffer (MLA: latent, k_rot; GQA: k, v)."""
    target = gen.target
    target.reset_cache()
    _, hidden = target.forward(tokens[:-1])
    refs = []
    for m, (module, length) in enumerate(zip(gen.drafter.modules, lengths), start=1):
        module.reset_cache()
        usable = len(tokens) - 1 - m  # positions whose token t+m exists
        post, _, _ = module.step(hidden[:usable], tokens[m : usable + m], 0)
        refs.append({name: module.cache.read(name)[:length].clone() for name in module.cache.buffers})
        hidden = post
    return refs


class _OracleDrafts:
    """Runs the real MTP drafter (its caches see every draft) but picks the plain-greedy continuation
    as the draft, wrong at position ``bad``: acceptance becomes controllable (bad-1 per round)."""

    def __init__(self, inner, full_sequence, bad, vocab):
        self.inner, self.full, self.bad, self.vocab = inner, full_sequence, bad, vocab
        self.drafted = False
        self.snapshots = []

    def reset(self, slots=1):
        self.inner.reset(slots)

    def clear_slot(self, slot):
        self.inner.clear_slot(slot)

    def observe_rows(self, slots, hiddens, starts):
        self.inner.observe_rows(slots, hiddens, starts)

    def propose_rows(self, slots, seqs, ks, picks):
        n, j = len(seqs[0]), [0]
        self.drafted = ks[0] > 0

        def oracle(logits):
            j[0] += 1
            token = self.full[n - 1 + j[0]]
            return ((token + 1) % self.vocab if j[0] == self.bad else token), None

        return self.inner.propose_rows(slots, seqs, ks, [oracle])

    def rollback_rows(self, slots, committed):
        self.inner.rollback_rows(slots, committed)
        # a plain step (K = 0: the last token of a run) drafts nothing: the modules do not catch up then
        drafted, self.drafted = self.drafted, False
        self.snapshots.append((committed[0], drafted, [(mod.cache.lengths[0], {n: mod.cache.read(n).clone()
                                                                      for n in mod.cache.buffers})
                                              for mod in self.inner.modules]))

    def cache_lengths(self):
        return self.inner.cache_lengths()


@pytest.mark.parametrize("bad", [1, 2, None], ids=["reject-first", "accept-one", "accept-all"])
@pytest.mark.parametrize("fixture", ["gen_d1", "gen_d2", "gen_glm", "gen_qwen3"])
def test_mtp_cache_after_rollback_equals_recompute(request, fixture, bad):
    """After (partial) acceptance the kept MTP caches are exactly what the final sequence implies."""
    gen = request.getfixturevalue(fixture)
    prompt = gen.encode(PROMPT)
    plain = gen.generate(prompt, max_new_tokens=16, ignore_eos=True)
    oracle = _OracleDrafts(gen.drafter, prompt + plain.tokens, bad, gen.config.vocab_size)
    result = gen.generate(prompt, max_new_tokens=16, ignore_eos=True, speculative_k=3, drafter=oracle)
    assert result.tokens == plain.tokens
    expected_accept = 3 if bad is None else bad - 1
    assert result.stats.accepted[0] == (result.stats.rounds if expected_accept else 0)
    seq = prompt + result.tokens
    before = len(prompt) + 1  # committed tokens when the first round starts
    assert oracle.snapshots
    for committed, drafted, caches in oracle.snapshots:
        # module m had positions 0..N-2 in depth mode (N = committed before the round) and keeps those
        # with t + m <= N'-2: the token they read is final, not a rejected draft
        # (module m >= 2 only runs in rounds with k >= m, so it may lag behind: never ahead)
        lengths = [length for length, _ in caches]
        assert lengths[0] == min(before - 1, committed - 2) if drafted else lengths[0] <= min(before - 1, committed - 2)
        assert all(length <= min(before - 1, committed - 1 - m) for m, length in enumerate(lengths, start=1))
        refs = _reference_mtp_caches(gen, seq[:committed], lengths)
        for (_, kept), ref in zip(caches, refs):
            assert kept.keys() == ref.keys()
            for name in ref:
                assert torch.allclose(kept[name], ref[name], atol=1e-5), name
        before = committed


def _with_eos(gen, eos_id):
    gen.target.config = replace(gen.target.config, eos_token_id=eos_id)


def test_eos_inside_accepted_run_ends_at_the_right_token(gen_d1):
    plain = gen_d1.generate(PROMPT, max_new_tokens=20, ignore_eos=True)
    original = gen_d1.target.config
    position = next(i for i in range(4, 20) if plain.tokens[i] not in plain.tokens[:i])
    try:
        _with_eos(gen_d1, plain.tokens[position])
        for k in (1, 2, 3):
            spec = gen_d1.generate(PROMPT, max_new_tokens=20, speculative_k=k, drafter=TargetAsDraft(gen_d1.target))
            assert spec.tokens == plain.tokens[: position + 1]
            assert spec.stats.finish_reason == "eos"
            assert spec.text == gen_d1.decode(plain.tokens[:position])
    finally:
        gen_d1.target.config = original


def test_stop_string_inside_accepted_run(gen_d1):
    plain = gen_d1.generate(PROMPT, max_new_tokens=20, ignore_eos=True)
    pieces = [gen_d1.decode(plain.tokens[: i + 1]) for i in range(20)]
    i = next(i for i in range(5, 20) if len(pieces[i]) > len(pieces[i - 1]) + 1 and pieces[i][-2:] not in pieces[i - 1])
    stop = pieces[i][-2:]
    for k in (0, 2, 3):
        spec = gen_d1.generate(PROMPT, max_new_tokens=20, speculative_k=k, stop=[stop], ignore_eos=True,
                               drafter=TargetAsDraft(gen_d1.target) if k else None)
        assert spec.stats.finish_reason == "stop"
        assert spec.tokens == plain.tokens[: i + 1]
        assert spec.text == pieces[i][: pieces[i].find(stop)]
