"""OUT/SERVING.md, which ``convert to-hf`` writes and prints: per engine, the commands that serve the
export written (its layout, paths and dtype) and what does not work, from the engine facts and the
problems of serving.py.
"""

from __future__ import annotations

import json
import shlex

from megatron_mtp.convert.serving import (
    FACTS,
    FLASH_MLA_HEAD_SIZE,
    SGLANG_DEFAULT_STEPS,
    Export,
    Problem,
    transformers_mtp_layers,
)
from megatron_mtp.models.family import get_family

# -- commands ------------------------------------------------------------------------------------------


def _dtype_flag(e: Export) -> list[str]:
    return ["--dtype", "bfloat16"] if e.dtype == "fp32" else []


def vllm_argv(e: Export, draft: bool) -> list[str]:
    argv = ["vllm", "serve", str(e.main_dir), *_dtype_flag(e)]
    if not draft:
        return argv
    spec: dict = {"method": e.draft.vllm_method}
    if e.layout == "separate" and not e.draft.own_model:
        # the draft's depth comes from the target's config.json, which says 0 in main/
        argv += ["--hf-overrides", json.dumps({"num_nextn_predict_layers": e.depth})]
        spec["model"] = str(e.mtp_dir)
    if e.draft.own_model:  # vLLM's proposer reads the drafter's own config.json
        spec["model"] = str(e.mtp_dir)
    spec["num_speculative_tokens"] = e.draft_tokens
    return argv + ["--speculative-config", json.dumps(spec)]


def sglang_steps(e: Export) -> int:
    """NEXTN steps: --speculative, else the depth a repeated module was trained for, else SGLang's default."""
    if e.draft.own_model:  # the steps it was trained for
        return e.speculative or e.depth
    return e.speculative or (e.repeats if e.repeats > 1 else SGLANG_DEFAULT_STEPS)


def sglang_argv(e: Export, draft: bool) -> list[str]:
    argv = ["python", "-m", "sglang.launch_server", "--model-path", str(e.main_dir), *_dtype_flag(e)]
    if not draft:
        return argv
    steps = sglang_steps(e)
    argv += ["--speculative-algorithm", e.draft.sglang_algorithm]
    if e.layout in ("separate", "nextn"):
        argv += ["--speculative-draft-model-path", str(e.mtp_dir)]
    return argv + ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
                   "--speculative-num-draft-tokens", str(steps + 1)]


def render(argv: list[str], head: int) -> str:
    """A command line: its first ``head`` words, then each further flag (and its value) on a line of its own."""
    lines, current = [], [shlex.quote(t) for t in argv[:head]]
    for token in argv[head:]:
        if token.startswith("--"):
            lines.append(current)
            current = []
        current.append(shlex.quote(token))
    lines.append(current)
    return " \\\n    ".join(" ".join(line) for line in lines)


def render_vllm(e: Export, draft: bool) -> str:
    return render(vllm_argv(e, draft), 3)


def render_sglang(e: Export, draft: bool) -> str:
    return render(sglang_argv(e, draft), 5)


def mtp_ignore_patterns(e: Export) -> list[str]:
    """The pattern list transformers needs to find this export's MTP layers (transformers_mtp_layers)."""
    return [rf"model\.layers\.{e.num_layers + d}\." for d in range(e.depth)]


def transformers_code(e: Export) -> str:
    """Load the main model and generate greedily."""
    main = json.dumps(str(e.main_dir))
    return "\n".join([
        "from transformers import AutoModelForCausalLM, AutoTokenizer",
        "",
        f"tokenizer = AutoTokenizer.from_pretrained({main})",
        f"model = AutoModelForCausalLM.from_pretrained({main})",
        'ids = tokenizer("def add(a, b):", return_tensors="pt").input_ids',
        "out = model.generate(ids, max_new_tokens=32, do_sample=False)",
        "print(tokenizer.decode(out[0]))",
    ])


def transformers_mtp_code(e: Export) -> str:
    """What follows ``transformers_code`` to generate with the MTP draft."""
    lines = []
    if e.layout == "separate":
        lines += [
            f"model.config.num_mtp_layers = {e.depth}  # main/config.json says 0: it holds no MTP layer",
            f"model.config.name_or_path = {json.dumps(str(e.mtp_dir))}  # where transformers reads MTP weights",
        ]
    if not e.transformers_finds_mtp:
        patterns = ", ".join(f'r"{p}"' for p in mtp_ignore_patterns(e))
        lines.append(f"model._keys_to_ignore_on_load_unexpected = [{patterns}]  # the MTP layers")
    lines += [
        "out = model.generate(ids, max_new_tokens=32, do_sample=False, use_mtp=True)  # one sequence at a time",
        "print(tokenizer.decode(out[0]))",
    ]
    return "\n".join(lines)


# -- SERVING.md ----------------------------------------------------------------------------------------

_LAYOUT_WORDS = {
    "inline": "inline: the main model and its MTP modules in one directory (the release layout)",
    "separate": "separate: main/ holds the main model, mtp/ the MTP modules (release naming)",
    "nextn": "separate, NextN: main/ holds the main model, mtp/ SGLang's NextN directory",
    "none": "main model only",
}


def _block(text: str, lang: str = "bash") -> list[str]:
    return [f"```{lang}", text, "```", ""]


def _draft_words(e: Export) -> str:
    if e.draft.words is not None:  # its MTP style's
        return e.draft.words(e)
    if e.repeats > 1:
        return f"1 MTP module trained to draft {e.repeats} tokens by applying it again (mtp.repeated_layer)"
    return f"{e.depth} MTP module" + ("s" if e.depth > 1 else "")


def _section_vllm(e: Export, blocked: list[Problem]) -> list[str]:
    out = ["## vLLM", "", "Main model:", "", *_block(render_vllm(e, False))]
    if e.depth and not any(p.blocks == "draft" for p in blocked):
        k = e.draft_tokens
        where = "read from mtp/" if e.layout == "separate" else "read from the same directory"
        out += [f"With the MTP draft ({k} draft token{'s' if k > 1 else ''} per step, {where}):", "",
                *_block(render_vllm(e, True))]
        if e.layout == "separate" and not e.draft.own_model:
            out += ["vLLM builds the draft from the target's config.json, and main/config.json says "
                    "`num_nextn_predict_layers: 0` (main/ holds no MTP layer), hence `--hf-overrides`.", ""]
    out.append("Add `--tensor-parallel-size N` to spread the model over N GPUs.")
    if e.mla_head_size is not None and e.mla_head_size != FLASH_MLA_HEAD_SIZE:
        out.append(f"This model's MLA head size is {e.mla_head_size}; vLLM's FlashAttention MLA kernel takes only "
                   f"{FLASH_MLA_HEAD_SIZE}: if vLLM picks it and refuses, add `--attention-backend TRITON_MLA`.")
    return out + [""]


def _section_sglang(e: Export, blocked: list[Problem]) -> list[str]:
    out = ["## SGLang", "", "Main model:", "", *_block(render_sglang(e, False))]
    if e.depth and not any(p.blocks == "draft" for p in blocked):
        steps = sglang_steps(e)
        where = "read from mtp/" if e.layout in ("separate", "nextn") else "read from the same directory"
        out += [f"With the MTP draft ({e.draft.sglang_how} applied {steps} times per step, {where}):", "",
                *_block(render_sglang(e, True))]
    if e.dtype == "fp32":
        out.append("`--dtype bfloat16`: with `--dtype auto` SGLang would run an fp32 export in float16.")
    out.append("Add `--tp-size N` to spread the model over N GPUs.")
    return out + [""]


def _section_transformers(e: Export, blocked: list[Problem]) -> list[str]:
    out = ["## transformers (5.x)", "", "Main model:", "", *_block(transformers_code(e), "python")]
    known = " and ".join(str(n) for n in transformers_mtp_layers(e.family))
    if e.layout == "inline" and not known:
        out += ["transformers reports the MTP module's tensors (`mtp.*`) as unexpected keys when it loads the main "
                "model, which has no MTP layer. The model is complete.", ""]
    elif e.layout == "inline" and not e.transformers_finds_mtp:
        out += [f"transformers reports the MTP layers (`model.layers.{e.num_layers}.*`...) as unexpected keys "
                f"when it loads the main model: it skips only the literal layer {known}. The model is complete.", ""]
    if e.depth and e.draft.transformers_code is not None:  # a model of its own as transformers' assistant model
        out += ["With the assistant drafting (transformers' assisted decoding, one sequence at a time):", "",
                *_block(e.draft.transformers_code(e), "python")]
    elif e.depth and not any(p.blocks == "draft" for p in blocked):
        out += ["With the MTP draft, continue with the lines below. `generate(..., use_mtp=True)` is assisted "
                f"decoding with the model's own MTP layers: one draft token per MTP module ({e.depth} per step "
                "here), one sequence at a time, greedy or sampling, and the MTP weights are read from disk again on "
                f"every call. transformers looks for MTP layers only at the literal layer {known} (the "
                "releases' one module), so the code names this export's.", "",
                *_block(transformers_mtp_code(e), "python"),
                "Do not put `use_mtp` into generation_config.json: every `generate` call would become batch-1 "
                "assisted decoding.", ""]
    return out


def serving_text(e: Export, found: list[Problem]) -> str:
    """OUT/SERVING.md: the commands that serve this export, per engine, and what does not work."""
    lines = [
        "# Serving this export", "",
        f"Written by `megatron-mtp convert to-hf`. Layout: "
        f"{e.draft.layout_words or _LAYOUT_WORDS[e.layout]}; "
        f"{e.dtype}; "
        f"{e.num_layers} main layer{'s' if e.num_layers > 1 else ''}"
        + (f", {_draft_words(e)}." if e.depth else "."),
        "",
        "The vLLM (0.33) and SGLang (0.5.23) commands follow from reading their weight loaders; they were not "
        "run (neither runs on a CPU). The project's tests run the transformers code on a small export of each "
        "layout.",
        "",
    ]
    lines += [*get_family(e.family).serving.notes, ""] if e.depth and not e.draft.own_model else []
    if found:
        lines += ["What does not work:", ""]
        lines += [f"- {p.sentence}." for p in found]
        lines.append("")
    sections = {"vllm": _section_vllm, "sglang": _section_sglang, "transformers": _section_transformers}
    for engine, section in sections.items():
        mine = [p for p in found if p.engine == engine]
        if any(p.blocks == "model" for p in mine):
            lines += [f"## {FACTS[engine].title}", "", "It cannot load this export (see above).", ""]
            continue
        lines += section(e, mine)
        if e.depth and any(p.blocks == "draft" for p in mine):
            lines[-1:] = ["", "No MTP draft here (see above).", ""]
    return "\n".join(lines).rstrip() + "\n"
