"""Plain and speculative (MTP-drafted) generation of one sequence (batch_generate.py: many at once).

One round of speculative decoding (seq[N-1] is the pending token, target cache = N-1 positions):
1. the drafter proposes d_1..d_K (see draft.py for which hidden/token goes where);
2. the target runs ONE forward over [seq[N-1], d_1..d_K] (K+1 positions);
3. verify.py accepts a prefix of a drafts and emits one more token (correction or bonus);
4. rollback: target cache cut to N + a positions (inputs seq[N-1], d_1..d_a are final), the
   drafter keeps the target hidden states of those positions and cuts its own caches.
EOS, stop strings and the token budget are checked token by token over the a+1 new tokens, so
generation ends at exactly the token plain decoding would end at.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Literal

import torch

from megatron_mtp.errors import UserError
from megatron_mtp.inference.draft import Drafter, MTPDrafter
from megatron_mtp.inference.expert_counts import ExpertCounts
from megatron_mtp.inference.layers import HFConfig
from megatron_mtp.inference.results import GenerationResult, Output
from megatron_mtp.inference.sampling import SamplingParams, draw, probabilities
from megatron_mtp.inference.stats import GenerationStats
from megatron_mtp.inference.target import TargetModel
from megatron_mtp.inference.verify import verify

MAX_SPECULATIVE_K = 16


class Generator:
    """A loaded target model, its MTP drafter (if exported) and tokenizer."""

    def __init__(
        self,
        target: TargetModel,
        drafter: Drafter | None,
        tokenizer: Any | None,
        source: Path,
    ) -> None:
        self.target = target
        self.drafter = drafter
        self.tokenizer = tokenizer
        self.source = source

    @property
    def config(self) -> HFConfig:
        return self.target.config

    @property
    def has_mtp(self) -> bool:
        return self.drafter is not None

    def encode(self, text: str) -> list[int]:
        if self.tokenizer is None:
            raise UserError(
                f"{self.source} has no tokenizer.json, so text prompts and stop strings cannot be used; pass token ids."
            )
        return list(self.tokenizer.encode(text).ids)

    def decode(self, ids: list[int]) -> str:
        if self.tokenizer is None:
            raise UserError(f"{self.source} has no tokenizer.json, so output cannot be decoded to text.")
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def prompt_ids(self, prompt: str | list[int], label: str = "the prompt") -> list[int]:
        """Token ids of a prompt; ``label`` names it in errors (e.g. "the prompt on line 3 of F")."""
        ids = self.encode(prompt) if isinstance(prompt, str) else [int(t) for t in prompt]
        if not ids:
            raise UserError(f"{label} is empty after tokenization; give at least one token.")
        bad = [t for t in ids if not 0 <= t < self.config.vocab_size]
        if bad:
            raise UserError(f"{label} has token id {bad[0]}, outside the vocabulary (size {self.config.vocab_size}).")
        return ids

    def check_options(
        self, max_new_tokens: int, temperature: float, top_k: int, top_p: float, speculative_k: int,
        stop: list[str] | None, drafter: Any | None,
    ) -> tuple[SamplingParams, Any | None, list[str]]:
        """The options every generation shares, each refused in one sentence: (params, drafter, stop strings)."""
        params = SamplingParams(temperature=float(temperature), top_k=int(top_k), top_p=float(top_p))
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be a positive integer (got {max_new_tokens!r}).")
        if not isinstance(speculative_k, int) or not 0 <= speculative_k <= MAX_SPECULATIVE_K:
            raise UserError(
                f"speculative K must be an integer from 0 to {MAX_SPECULATIVE_K} (got {speculative_k!r}); "
                "use 0 for plain decoding."
            )
        if speculative_k and drafter is None:
            raise UserError(
                f"{self.source} has no MTP module, so --speculative cannot be used; "
                "drop --speculative or export the model with its MTP weights."
            )
        limit = getattr(drafter, "max_draft", None)  # parallel heads draft one position each
        if speculative_k and limit is not None and speculative_k > limit:
            raise UserError(f"--speculative {speculative_k} asks for more draft tokens than the {limit} parallel MTP "
                            f"heads of {self.source} give (one position each); use K <= {limit}.")
        stop = [s for s in (stop or []) if s]
        if stop and self.tokenizer is None:
            raise UserError(f"{self.source} has no tokenizer.json, so stop strings cannot be matched; drop --stop.")
        return params, drafter, stop

    def generate_batch(self, prompts: list[str | list[int]], **options: Any) -> Any:
        """Many prompts, ``batch_size`` at a time with continuous batching: a ``batch_generate.BatchResult``."""
        from megatron_mtp.inference.batch_generate import generate_batch

        return generate_batch(self, prompts, **options)

    def generate(
        self,
        prompt: str | list[int],
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        top_k: int = 0,
        top_p: float = 1.0,
        seed: int = 0,
        speculative_k: int = 0,
        stop: list[str] | None = None,
        ignore_eos: bool = False,
        drafter: Drafter | None = None,
    ) -> GenerationResult:
        """Generate up to ``max_new_tokens``; ``speculative_k > 0`` drafts K tokens per round with MTP."""
        params, drafter, stop = self.check_options(max_new_tokens, temperature, top_k, top_p, speculative_k, stop,
                                                   drafter or self.drafter)
        ids = self.prompt_ids(prompt)
        if len(ids) + max_new_tokens + speculative_k > self.config.max_position_embeddings:
            raise UserError(
                f"prompt ({len(ids)} tokens) + max_new_tokens ({max_new_tokens}) + K exceeds the model's "
                f"max_position_embeddings ({self.config.max_position_embeddings}); shorten one of them."
            )
        eos = set() if ignore_eos else set(self.config.eos_token_ids)
        output = Output(self, max_new_tokens, stop, eos)
        return _Generation(self, params, seed, speculative_k, drafter, output).run(ids)


class _Generation:
    """One generate() call: its sampling state, statistics and round loop."""

    def __init__(
        self, g: Generator, params: SamplingParams, seed: int, k: int, drafter: Drafter | None, out: Output
    ) -> None:
        self.g, self.params, self.k, self.drafter, self.out = g, params, k, drafter, out
        self.rng = torch.Generator().manual_seed(int(seed))
        self.stats = GenerationStats(speculative_k=k)
        self.experts = ExpertCounts()
        self.experts.attach(g.target, drafter if k else None)

    def _pick(self, logits: torch.Tensor) -> tuple[int, torch.Tensor | None]:
        if self.params.greedy:
            return int(torch.argmax(logits).item()), None
        probs = probabilities(logits, self.params)
        return draw(probs, self.rng), probs

    def _target(self, tokens: list[int], last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        t0 = time.perf_counter()
        logits, hidden = self.g.target.forward(tokens, last_only=last_only)
        self.stats.target_time_s += time.perf_counter() - t0
        self.stats.target_forwards += 1
        self.stats.decode_forwards += 1
        return logits, hidden

    def run(self, ids: list[int]) -> GenerationResult:
        stats, target = self.stats, self.g.target
        stats.prompt_tokens = len(ids)
        start = time.perf_counter()
        target.reset_cache()
        if self.k:
            assert self.drafter is not None
            self.drafter.reset()
        logits, hidden = target.forward(ids, last_only=True)
        stats.prefill_time_s = time.perf_counter() - start
        stats.target_forwards = 1
        if self.k:
            assert self.drafter is not None
            self.drafter.observe_target(hidden, 0)
        seq = list(ids)
        token = self._pick(logits[-1])[0]
        seq.append(token)
        done = self.out.push(token)
        while not done:
            budget = self.out.max_new - len(self.out.tokens)
            k = min(self.k, budget - 1)
            if k <= 0:  # plain step (also the last step of a speculative run)
                with self.experts.phase("plain"):
                    logits, _ = self._target([seq[-1]], last_only=True)
                token = self._pick(logits[-1])[0]
                seq.append(token)
                done = self.out.push(token)
                continue
            done = self._speculative_round(seq, k)
        stats.wall_time_s = time.perf_counter() - start
        stats.new_tokens = len(self.out.tokens)
        stats.finish_reason = self.out.finish_reason
        if self.experts.num_experts:
            stats.experts = self.experts.summary(stats.new_tokens, target.dtype.itemsize)
        return GenerationResult(text=self.out.text(), tokens=list(self.out.tokens), stats=stats)

    def _speculative_round(self, seq: list[int], k: int) -> bool:
        drafter = self.drafter
        assert drafter is not None
        n = len(seq)
        t0 = time.perf_counter()
        with self.experts.phase("draft"):
            drafts, dists = drafter.propose(seq, k, self._pick)
        self.stats.draft_time_s += time.perf_counter() - t0
        self.stats.draft_steps += k
        with self.experts.phase("verify"):
            logits, hidden = self._target([seq[-1]] + drafts)
        n_accepted, extra = verify(logits, drafts, dists, self.params, self.rng)
        self.g.target.truncate_cache(n + n_accepted)
        with self.experts.phase("draft"):  # the MTP layer over the verified positions
            drafter.observe_target(hidden[: n_accepted + 1], n - 1)
        new_tokens = drafts[:n_accepted] + [extra]
        seq.extend(new_tokens)
        drafter.rollback(len(seq))
        self.stats.record_round(k, n_accepted)
        for token in new_tokens:
            if self.out.push(token):
                return True
        return False


def load_generator(
    model_dir: str | Path,
    dtype: str | torch.dtype = "float32",
    chain_hidden: Literal["post_norm", "pre_norm"] = "post_norm",
) -> Generator:
    """Load an exported HF directory (main/ + mtp/, inline, or plain) or a megatron checkpoint/run dir."""
    from megatron_mtp.inference.checkpoint_source import hf_dir_for
    from megatron_mtp.inference.model_dir import find_export_dirs, load_mtp_modules, load_target, parse_dtype
    from megatron_mtp.inference.parallel_draft import load_parallel_heads

    torch_dtype = parse_dtype(dtype)
    dirs = find_export_dirs(hf_dir_for(Path(model_dir)))
    target, main_weights = load_target(dirs, torch_dtype)
    parallel = load_parallel_heads(dirs, target, torch_dtype)  # mtp/ holding parallel heads (parallel_draft.py)
    modules = [] if parallel is not None else load_mtp_modules(dirs, target, main_weights, torch_dtype)
    tokenizer = None
    if dirs.tokenizer_file is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(dirs.tokenizer_file))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise UserError(
                f"{dirs.tokenizer_file} is not a readable tokenizer ({exc}); re-export the model."
            ) from exc
    drafter = parallel if parallel is not None else MTPDrafter(modules, chain_hidden=chain_hidden) if modules else None
    return Generator(target, drafter, tokenizer, dirs.root)
