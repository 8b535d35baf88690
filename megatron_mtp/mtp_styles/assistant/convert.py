"""A separate drafter in Hugging Face form: a model directory of its own in mtp/ (hf_format.py; Gemma 4's
``gemma4_assistant``), its generation_config.json saying how many tokens it drafts; the target's config.json says
no MTP layer. Every serving engine here drafts with it from that directory."""

from __future__ import annotations

import json
from typing import Any, Optional

from megatron_mtp.convert.hf_source import GENERATION_CONFIG
from megatron_mtp.convert.serving import DraftServing
from megatron_mtp.mtp_styles.assistant import hf_format


def claims(config: dict[str, Any]) -> bool:
    return hf_format.is_assistant_config(config)


def import_depth(main, mtp, with_mtp: bool) -> int:
    """The tokens it drafts per round (its generation_config.json)."""
    return hf_format.draft_tokens(mtp.path) if with_mtp else 0


def drafter_params(cfg, vocab: int) -> list:
    return hf_format.assistant_params(cfg, vocab)


def drafter_shapes(cfg, vocab: int) -> dict[str, tuple[int, ...]]:
    return hf_format.shapes(cfg, vocab)


def import_shape(mtp_cfg, mtp_dir, model_cfg, vocab: int) -> None:
    """Its shape from its config.json; it trains on the frozen target (mtp.freeze_base)."""
    where = str(mtp_dir.path / "config.json")
    mtp_cfg.assistant, mtp_cfg.freeze_base = hf_format.shape_from_hf(mtp_dir.config, model_cfg, vocab, where), True


def mtp_config(cfg, vocab: int, full: dict, depth: int, dtype: str, mtp_layout: str, family, target=None,
               speculative: Optional[int] = None) -> dict:
    torch_dtype = "float32" if dtype == "fp32" else "bfloat16"
    return hf_format.configs(cfg, vocab, torch_dtype, None)[0]


def check_export(mtp: Optional[str], mtp_layout: Optional[str], serve_for: Optional[str], has_mtp: bool):
    return hf_format.check_layout(mtp, mtp_layout, serve_for) if has_mtp else mtp


def _words(e) -> str:
    return (f"an assistant drafter in mtp/ (Gemma4AssistantForCausalLM, trained for {e.depth} draft "
            f"step{'s' if e.depth > 1 else ''}; the target is unchanged in main/)")


def transformers_code(e) -> str:
    """What follows serving_text.py's ``transformers_code`` to generate with the assistant (Gemma 4)."""
    return "\n".join([
        "from transformers import Gemma4AssistantForCausalLM",
        "",
        f"assistant = Gemma4AssistantForCausalLM.from_pretrained({json.dumps(str(e.mtp_dir))})",
        "out = model.generate(ids, max_new_tokens=32, do_sample=False, assistant_model=assistant)",
        "print(tokenizer.decode(out[0]))",
    ])


def serving_flags() -> dict:
    """vLLM, SGLang (FROZEN_KV_MTP, by the drafter's architecture) and transformers draft with it from mtp/."""
    return {"draft": DraftServing(
        kind="assistant", own_model=True, words=_words, sglang_how="the assistant, FROZEN_KV_MTP",
        layout_words="separate: main/ holds the target, mtp/ its assistant", transformers_code=transformers_code)}


def extra_files(cfg, vocab: int, speculative: Optional[int]) -> dict[str, dict]:
    return {GENERATION_CONFIG: hf_format.configs(cfg, vocab, "", speculative)[1]}
