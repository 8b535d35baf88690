"""A loaded model to generate from (``Generator``) and its loading (``load_generator``).

``generate`` (one prompt) and ``generate_batch`` (many) run the one decode loop of batch_generate.py:
one prompt is a batch of one. Its options are checked once, by options.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Literal

import torch

from megatron_mtp.config.mtp_style import MTPStyle, style_of_mtp_dir
from megatron_mtp.errors import UserError
from megatron_mtp.inference.batch_generate import BatchResult, OnText, generate_batch
from megatron_mtp.inference.draft import Drafter
from megatron_mtp.inference.options import DecodeOptions
from megatron_mtp.inference.results import GenerationResult
from megatron_mtp.inference.target import TargetModel
from megatron_mtp.models.decoding.layers import HFConfig
from megatron_mtp.models.family import assistant_family, family_of_hf_config


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

    def generate_batch(
        self,
        prompts: list[str | list[int]],
        max_new_tokens: int | list[int] = 64,
        *,
        options: DecodeOptions | None = None,
        labels: list[str] | None = None,
        on_text: OnText | None = None,
        drafter: Drafter | None = None,
        **decode: Any,
    ) -> BatchResult:
        """Many prompts, ``batch_size`` at a time with continuous batching. ``options`` (checked already)
        or the fields of ``DecodeOptions`` as keywords (temperature, top_k, top_p, seed, speculative_k,
        stop, ignore_eos, batch_size, default 8); ``drafter`` replaces the model's own."""
        if options is None:
            options = DecodeOptions(**{"batch_size": 8, **decode})
        elif decode:
            raise TypeError(f"give either options or {sorted(decode)}, not both")
        return generate_batch(self, prompts, max_new_tokens, options, labels=labels, on_text=on_text,
                              drafter=drafter)

    def generate(
        self,
        prompt: str | list[int],
        max_new_tokens: int = 64,
        *,
        options: DecodeOptions | None = None,
        on_text: OnText | None = None,
        drafter: Drafter | None = None,
        **decode: Any,
    ) -> GenerationResult:
        """Up to ``max_new_tokens`` for one prompt; ``speculative_k > 0`` drafts K tokens per round with MTP.
        A batch of one: the result's statistics include the run's routed-expert counts."""
        batch = self.generate_batch([prompt], max_new_tokens, options=options, labels=["the prompt"], on_text=on_text,
                                    drafter=drafter, **decode)
        result = batch.results[0]
        result.stats.experts = batch.stats.experts
        return result


def _mtp_dir_style(path: Path | None) -> MTPStyle:
    """The MTP style whose format the export's mtp/ is (config/mtp_style.py ``style_of_mtp_dir``): the release's
    MTP layers where it has none or no readable config.json."""
    import json

    try:
        config = json.loads((path / "config.json").read_text()) if path is not None else None
    except (OSError, ValueError):
        config = None
    return style_of_mtp_dir(config if isinstance(config, dict) else None)


def load_assistant(path: str | Path, target: TargetModel, dtype: torch.dtype) -> Drafter:
    """A separate drafter's directory (a Gemma 4 assistant) drafting for ``target``: the family whose drafter its
    config.json names (else the target's) builds and checks it (the drafter in its ``style_parts``:
    mtp_styles/assistant/family_part.py), its weights load
    here; a directory in a separate-drafter style's own format loads through that style's decoder, as the export's
    mtp/ would."""
    import json

    from megatron_mtp.hf_dir.safetensors_io import HFDir
    from megatron_mtp.inference.model_dir import _load_into

    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    style = style_of_mtp_dir(config if isinstance(config, dict) else None)
    if style.separate_drafter and isinstance(config, dict) and assistant_family(config) is None:
        # a drafter in its MTP style's own format: that style's decoder loads it
        return style.decoder().load_drafter(None, Path(path), target, None, dtype, "post_norm")
    weights = HFDir(Path(path))
    family = assistant_family(weights.config) or family_of_hf_config({"model_type": target.config.model_type})
    drafter = next((p for p in family.style_parts.values() if hasattr(p, "decoder") and hasattr(p, "drafter")), None)
    if drafter is None:
        raise UserError(f"'{path}' is not a separate drafter of {family.title} (its config.json's model_type is "
                        f"{weights.config.get('model_type')!r}), and {family.title} has none; draft with the "
                        "model's MTP modules instead")
    model = drafter.decoder(weights.config, weights.path, target)
    _load_into(model, weights, "", dtype, 0, aliases={})
    return drafter.drafter(model.eval(), target)


def load_generator(
    model_dir: str | Path,
    dtype: str | torch.dtype = "float32",
    chain_hidden: Literal["post_norm", "pre_norm"] = "post_norm",
    assistant: str | Path | None = None,
) -> Generator:
    """Load an exported HF directory (main/ + mtp/, inline, or plain) or a megatron checkpoint/run dir;
    ``assistant``: a Gemma 4 assistant directory that drafts instead of the MTP modules
    (models/gemma4/assistant/decoder.py)."""
    from megatron_mtp.inference.checkpoint_source import hf_dir_for
    from megatron_mtp.inference.model_dir import find_export_dirs, load_target, parse_dtype

    torch_dtype = parse_dtype(dtype)
    dirs = find_export_dirs(hf_dir_for(Path(model_dir)))
    style, drafter_dir = _mtp_dir_style(dirs.mtp_dir), None
    if style.separate_drafter:  # an export of a trained drafter: a model of its own, not the target's MTP layers
        drafter_dir, dirs = dirs.mtp_dir, dataclasses.replace(dirs, mtp_dir=None)
    target, main_weights = load_target(dirs, torch_dtype)
    drafter = style.decoder().load_drafter(dirs, drafter_dir, target, main_weights, torch_dtype, chain_hidden)
    tokenizer = None
    if dirs.tokenizer_file is not None:
        from tokenizers import Tokenizer

        try:
            tokenizer = Tokenizer.from_file(str(dirs.tokenizer_file))
        except Exception as exc:  # tokenizers raises a bare Exception subclass
            raise UserError(
                f"{dirs.tokenizer_file} is not a readable tokenizer ({exc}); re-export the model."
            ) from exc
    if assistant is not None:  # told to draft with this drafter instead
        drafter = load_assistant(assistant, target, torch_dtype)
    return Generator(target, drafter, tokenizer, dirs.root)
