"""The decode loop: one prompt or many, with MTP drafts and continuous batching (one prompt is a batch
of one through the same code: ``Generator.generate``).

Up to ``batch_size`` sequences decode together, each in a cache slot (models/decoding/kv_cache.py). A step:
1. admit: free slots take the next prompts; their prefills run as one forward of rows of different
   lengths (not counted as decode forwards);
2. draft: each sequence gets its own K = min(--speculative, tokens it may still emit - 1); draft step
   j runs once over the sequences with K >= j (draft.py, mtp_styles/parallel/drafter.py);
3. verify: ONE target forward over every active sequence, row b = [pending_b, d_b1..d_bK_b]
   (B·(K+1) tokens; ``seq[N-1]`` is the pending token, the target cache holds N-1 positions); with
   --speculative 0, or when every K is 0, this is a plain step of B tokens;
4. per sequence: verify.py accepts a_b drafts and emits one token (correction or bonus); the target
   slot is cut to N_b + a_b (inputs seq[N-1], d_1..d_a are final), the drafter keeps the verified
   hidden states and rolls its slot back;
5. EOS, stop strings and the token budget are checked token by token per sequence over the a+1 new
   tokens, so a sequence ends at exactly the token plain decoding would end at; a finished sequence
   frees its slot for the next prompt at once.
Every sequence samples with its own generator seeded ``seed + index``, drawing in the same order as
a batch-1 run, so sequence i is the batch-1 run with seed ``seed + i``; greedy output equals plain
greedy decoding of each prompt alone (tested). A sequence's ``target_time_s``/``draft_time_s`` are
the times of the decode forwards and draft steps it took part in (shared with the others of its batch).
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from megatron_mtp.errors import UserError
from megatron_mtp.inference.draft import Drafter, PickFn
from megatron_mtp.inference.expert_counts import ExpertCounts, expert_line
from megatron_mtp.inference.options import DecodeOptions, DecodingModel, check_budget
from megatron_mtp.inference.results import GenerationResult, Output
from megatron_mtp.inference.sampling import draw, probabilities
from megatron_mtp.inference.stats import AcceptanceCounts, GenerationStats
from megatron_mtp.inference.text_stream import TextStream
from megatron_mtp.inference.verify import verify

#: streaming: called with (prompt index, newly final text, None) as text becomes final, and once with
#: (index, the rest of the text, its result) when the sequence finishes
OnText = Callable[[int, str, "GenerationResult | None"], None]


@dataclass
class BatchStats(AcceptanceCounts):
    """Counters of a batched run (rounds: sequence-rounds that judged drafts); derived ratios are
    properties (and appear in ``to_dict``)."""

    sequences: int = 0
    batch_size: int = 0
    speculative_k: int = 0
    new_tokens: int = 0
    wall_time_s: float = 0.0
    prefill_forwards: int = 0
    prefill_time_s: float = 0.0
    plain_forwards: int = 0  # decode forwards with no drafts (B tokens)
    verify_forwards: int = 0  # decode forwards verifying drafts (B·(K+1) tokens)
    decode_rows: int = 0  # sequences summed over decode forwards
    decode_tokens: int = 0  # tokens committed by decode forwards (the prefills' first tokens excluded)
    target_time_s: float = 0.0  # decode forwards
    draft_forwards: int = 0
    draft_time_s: float = 0.0
    acceptance_per_sequence: list[float] = field(default_factory=list)  # input order; judged drafts only
    experts: dict = field(default_factory=dict)  # expert_counts.py's summary over the whole run

    def record_sequence_round(self, stats: GenerationStats, k: int, n_accepted: int) -> None:
        """One sequence's verification round, in its own counts and the batch's."""
        stats.record_round(k, n_accepted)
        self.record_round(k, n_accepted)

    @property
    def decode_forwards(self) -> int:
        return self.plain_forwards + self.verify_forwards

    @property
    def tokens_per_decode_forward(self) -> float:
        """Committed tokens per decode forward, all sequences together."""
        return self.decode_tokens / self.decode_forwards if self.decode_forwards else 0.0

    @property
    def sequences_per_forward(self) -> float:
        """Sequences per decode forward: B until the first finish, fewer while the last ones finish."""
        return self.decode_rows / self.decode_forwards if self.decode_forwards else 0.0

    @property
    def tokens_per_sequence_forward(self) -> float:
        """Committed tokens per sequence and decode forward (1 for plain decoding)."""
        return self.decode_tokens / self.decode_rows if self.decode_rows else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.wall_time_s if self.wall_time_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for name in ("decode_forwards", "sequences_per_forward", "tokens_per_decode_forward",
                     "tokens_per_sequence_forward", "acceptance_per_position", "acceptance_rate", "mean_accept_length",
                     "tokens_per_s"):
            out[name] = getattr(self, name)
        return out

    def summary_lines(self) -> list[str]:
        lines = [
            f"{self.sequences} prompts, batch size {self.batch_size}: {self.new_tokens} new tokens in "
            f"{self.wall_time_s:.3f} s ({self.tokens_per_s:.1f} tokens/s)",
            f"decode forwards: {self.decode_forwards} ({self.plain_forwards} plain, {self.verify_forwards} verify; "
            f"{self.sequences_per_forward:.1f} sequences each), "
            f"{self.tokens_per_decode_forward:.2f} committed tokens per forward, "
            f"{self.tokens_per_sequence_forward:.2f} per sequence and forward",
        ]
        if self.speculative_k:
            per_pos = ", ".join(f"{a:.3f}" for a in self.acceptance_per_position)
            per_seq = " ".join(f"{a:.2f}" for a in self.acceptance_per_sequence)
            lines += [f"speculative K={self.speculative_k}: mean accept length {self.mean_accept_length:.3f}, "
                      f"acceptance {self.acceptance_rate:.3f}, per position [{per_pos}]",
                      f"acceptance per sequence: {per_seq}"]
        if self.experts:
            lines.append(expert_line(self.experts))
        return lines


@dataclass
class BatchResult:
    """One result per prompt, in input order, and the run's statistics."""

    results: list[GenerationResult]
    stats: BatchStats


@dataclass
class _Seq:
    index: int
    tokens: list[int]  # prompt, then committed tokens
    out: Output
    rng: torch.Generator
    stats: GenerationStats
    stream: TextStream | None
    slot: int = -1
    started: float = 0.0


class _BatchRun:
    """One decode run: the queue, the slots and the step loop."""

    def __init__(self, g: DecodingModel, options: DecodeOptions, drafter: Drafter | None, slots: int,
                 on_text: OnText | None) -> None:
        self.g, self.params, self.drafter, self.on_text = g, options.sampling, drafter, on_text
        self.k = options.speculative_k  # options.for_model gives a drafter exactly when K > 0
        self.slots = slots
        self.stats = BatchStats(batch_size=slots, speculative_k=self.k)
        self.experts = ExpertCounts()
        self.experts.attach(g.target, drafter)
        self.active: dict[int, _Seq] = {}
        self.free = list(range(slots))[::-1]
        self.results: dict[int, GenerationResult] = {}

    def pick(self, s: _Seq) -> PickFn:
        """The token pick of sequence ``s``: argmax, or a draw from its sampling distribution with its generator."""
        def pick(logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
            if self.params.greedy:
                return int(torch.argmax(logits).item()), None
            probs = probabilities(logits, self.params)
            return draw(probs, s.rng), probs

        return pick

    def run(self, queue: deque[_Seq]) -> None:
        target = self.g.target
        target.reset_cache(self.slots)
        target.hand_layers(getattr(self.drafter, "target_layers", None))  # what the drafter reads of the target
        if self.drafter is not None:
            self.drafter.reset(self.slots)
        try:
            while queue or self.active:
                admitted = []
                while self.free and queue:
                    s = queue.popleft()
                    s.slot = self.free.pop()
                    admitted.append(s)
                if admitted:
                    self._prefill(admitted)
                if self.active:
                    self._step([self.active[slot] for slot in sorted(self.active)])
        finally:  # the target's own forward hands h_0 again outside a run
            target.hand_layers(None)

    def _prefill(self, seqs: list[_Seq]) -> None:
        target = self.g.target
        t0 = time.perf_counter()
        for s in seqs:
            s.started = t0
            target.truncate_cache(0, s.slot)
            if self.drafter is not None:
                self.drafter.clear_slot(s.slot)
        slots = [s.slot for s in seqs]
        logits, hidden = target.forward_rows(slots, [s.tokens for s in seqs], last_only=True)
        if self.drafter is not None:
            self.drafter.observe_rows(slots, list(torch.split(hidden, [len(s.tokens) for s in seqs])), [0] * len(seqs))
        self.stats.prefill_forwards += 1
        self.stats.prefill_time_s += time.perf_counter() - t0
        for row, s in enumerate(seqs):
            s.stats.prompt_tokens = len(s.tokens)
            s.stats.target_forwards = 1
            s.stats.prefill_time_s = time.perf_counter() - t0
            self.active[s.slot] = s
            self._commit(s, [self.pick(s)(logits[row])[0]])

    def _step(self, seqs: list[_Seq]) -> None:
        ks = [max(0, min(self.k, s.out.max_new - len(s.out.tokens) - 1)) for s in seqs]
        slots = [s.slot for s in seqs]
        drafts: list[list[int]] = [[] for _ in seqs]
        dists: list[list[torch.Tensor | None]] = [[] for _ in seqs]
        draft_time = 0.0
        if any(ks):
            assert self.drafter is not None
            t0 = time.perf_counter()
            with self.experts.phase("draft"):
                drafts, dists = self.drafter.propose_rows(slots, [s.tokens for s in seqs], ks,
                                                          [self.pick(s) for s in seqs])
            draft_time = time.perf_counter() - t0
            self.stats.draft_time_s += draft_time
            self.stats.draft_forwards += max(ks)
        kind = "verify" if any(ks) else "plain"
        t0 = time.perf_counter()
        with self.experts.phase(kind):
            logits, hidden = self.g.target.forward_rows(slots, [[s.tokens[-1]] + d for s, d in zip(seqs, drafts)])
        target_time = time.perf_counter() - t0
        self.stats.target_time_s += target_time
        self.stats.verify_forwards += kind == "verify"
        self.stats.plain_forwards += kind == "plain"
        self.stats.decode_rows += len(seqs)
        sizes = [k + 1 for k in ks]
        verified: list[tuple[int, int]] = []
        for s, d, q, row in zip(seqs, drafts, dists, torch.split(logits, sizes)):
            n_accepted, extra = verify(row, d, q, self.params, s.rng)
            self.g.target.truncate_cache(len(s.tokens) + n_accepted, s.slot)
            verified.append((n_accepted, extra))
        new = [d[:a] + [extra] for d, (a, extra) in zip(drafts, verified)]
        if self.drafter is not None:
            self.drafter.observe_rows(slots, [h[: a + 1] for h, (a, _) in zip(torch.split(hidden, sizes), verified)],
                                      [len(s.tokens) - 1 for s in seqs])
            self.drafter.rollback_rows(slots, [len(s.tokens) + len(t) for s, t in zip(seqs, new)])
        for s, k, (a, _), tokens in zip(seqs, ks, verified, new):
            s.stats.target_forwards += 1
            s.stats.decode_forwards += 1
            s.stats.target_time_s += target_time
            if k:
                s.stats.draft_steps += k
                s.stats.draft_time_s += draft_time
                self.stats.record_sequence_round(s.stats, k, a)
            before = len(s.out.tokens)
            self._commit(s, tokens)
            self.stats.decode_tokens += len(s.out.tokens) - before

    def _commit(self, s: _Seq, tokens: list[int]) -> None:
        """Push a round's tokens together; stream what became final; finish the sequence if it ended."""
        done = False
        for token in tokens:
            s.tokens.append(token)
            if s.out.push(token):
                done = True
                break
        if s.stream is not None and not done and self.on_text is not None:
            body = s.out.tokens[:-1] if s.out.tokens and s.out.tokens[-1] in s.out.eos else s.out.tokens
            chunk = s.stream.update(self.g.decode(body))
            if chunk:
                self.on_text(s.index, chunk, None)
        if done:
            self._finish(s)

    def _finish(self, s: _Seq) -> None:
        del self.active[s.slot]
        self.free.append(s.slot)
        s.stats.new_tokens = len(s.out.tokens)
        s.stats.finish_reason = s.out.finish_reason
        s.stats.wall_time_s = time.perf_counter() - s.started
        text = s.out.text()
        self.results[s.index] = GenerationResult(text=text, tokens=list(s.out.tokens), stats=s.stats)
        if s.stream is not None and self.on_text is not None:
            self.on_text(s.index, s.stream.finish(text), self.results[s.index])


def generate_batch(
    g: DecodingModel,
    prompts: list[str | list[int]],
    max_new_tokens: int | list[int],
    options: DecodeOptions,
    labels: list[str] | None = None,
    on_text: OnText | None = None,
    drafter: Drafter | None = None,
) -> BatchResult:
    """Generate for every prompt (``max_new_tokens`` one for all or one per prompt),
    ``options.batch_size`` at a time; ``labels`` name the prompts in errors ("the prompt on line 3 of
    F"); ``on_text`` streams; ``drafter`` replaces the model's own."""
    if not prompts:
        raise UserError("there are no prompts to generate from; give at least one.")
    budgets = list(max_new_tokens) if isinstance(max_new_tokens, list) else [max_new_tokens] * len(prompts)
    labels = labels or [f"prompt {i + 1}" for i in range(len(prompts))]
    if len(budgets) != len(prompts) or len(labels) != len(prompts):
        raise ValueError("max_new_tokens and labels need one entry per prompt")
    budgets = [check_budget(budget) for budget in budgets]
    drafter = options.for_model(g, drafter or g.drafter)
    if on_text is not None and g.tokenizer is None:
        raise UserError(f"{g.source} has no tokenizer.json, so --stream has no text to print; drop --stream.")
    eos = options.eos(g)
    stops = list(options.stop)
    queue: deque[_Seq] = deque()
    for i, (prompt, budget, label) in enumerate(zip(prompts, budgets, labels)):
        ids = g.prompt_ids(prompt, label)
        options.check_length(g, len(ids), budget, label)
        queue.append(_Seq(index=i, tokens=list(ids), out=Output(g, budget, stops, eos),
                          rng=torch.Generator().manual_seed(options.seed + i),
                          stats=GenerationStats(speculative_k=options.speculative_k),
                          stream=TextStream(stops) if on_text is not None else None))
    run = _BatchRun(g, options, drafter, min(options.batch_size, len(prompts)), on_text)
    start = time.perf_counter()
    run.run(queue)
    stats = run.stats
    stats.wall_time_s = time.perf_counter() - start
    results = [run.results[i] for i in range(len(prompts))]
    stats.sequences = len(results)
    stats.new_tokens = sum(len(r.tokens) for r in results)
    stats.acceptance_per_sequence = [r.stats.acceptance_rate for r in results]
    if run.experts.num_experts:
        stats.experts = run.experts.summary(stats.new_tokens, g.target.dtype.itemsize)
    return BatchResult(results=results, stats=stats)
