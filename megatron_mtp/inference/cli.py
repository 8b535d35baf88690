"""``megatron-mtp generate``: plain or MTP-speculative generation from an exported model.

Only parses arguments; torch and the model code are imported inside :func:`run_generate`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from megatron_mtp import strict_json
from megatron_mtp.config.dtypes import dtype_arg
from megatron_mtp.errors import UserError

if TYPE_CHECKING:
    from megatron_mtp.inference.options import DecodeOptions


def register(subparsers: argparse._SubParsersAction) -> None:
    from megatron_mtp.models.family import supported_text

    parser = subparsers.add_parser(
        "generate",
        help="generate text, optionally with MTP speculative decoding",
        description=f"Generate from an exported Hugging Face directory of a {supported_text(decoding=True)} model "
        "(main/ + mtp/, inline, or plain; the MTP layers draft) or from a megatron-mtp checkpoint/run directory "
        "(exported on the fly).",
    )
    parser.add_argument("model", help="exported model directory, or a megatron-mtp checkpoint/run directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file whose whole content is the prompt")
    source.add_argument("--prompts-file", help="many prompts: one per line, or a .jsonl file of {\"prompt\": ...} "
                        "objects (optional \"max_new_tokens\" each); results in input order")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--seed", type=int, default=0,
                        help="random seed for sampling (default 0; prompt i of --prompts-file draws with SEED + i)")
    parser.add_argument("--speculative", type=int, default=0, metavar="K",
                        help="draft K tokens per step with the MTP module(s) (0 = plain decoding)")
    parser.add_argument("--assistant", metavar="DIR",
                        help="draft with this Gemma 4 assistant model (a Gemma4AssistantForCausalLM directory; it "
                        "reads the target's keys and values) or EAGLE-3 drafter (a speculators directory) instead of "
                        "the MTP modules (with --speculative K)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS token")
    parser.add_argument("--dtype", type=dtype_arg(("fp32", "bf16", "fp16")), default="fp32", metavar="fp32|bf16|fp16",
                        help="compute dtype (default fp32)")
    parser.add_argument("--batch-size", type=int, default=8, metavar="B",
                        help="with --prompts-file: sequences decoded together; a finished one frees its place for the "
                             "next prompt (default 8)")
    parser.add_argument("--stream", action="store_true",
                        help="print text as it is committed (several prompts: one '[i] \"chunk\"' line per chunk; "
                             "with --json one event object per line)")
    parser.add_argument("--stats", action="store_true", help="print decoding statistics to stderr")
    parser.add_argument("--json", action="store_true",
                        help="print JSON: one object (--prompt), or one per prompt and a last {\"summary\": ...} "
                             "(--prompts-file)")
    parser.set_defaults(func=run_generate)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    path = Path(args.prompt_file)
    if path.is_dir():
        raise UserError(f"prompt file {path} is a directory; pass a file whose content is the prompt to --prompt-file.")
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; pass an existing file to --prompt-file.")
    try:
        return path.read_text(encoding="utf-8-sig")  # a byte-order mark is not part of the prompt
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"prompt file {path} cannot be read as UTF-8 text ({exc}).") from exc


def _options(args: argparse.Namespace) -> DecodeOptions:
    """The decode options, checked (options.py) before the model loads."""
    from megatron_mtp.inference.options import DecodeOptions, check_budget

    check_budget(args.max_new_tokens)
    return DecodeOptions(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed,
                         speculative_k=args.speculative, stop=args.stop, ignore_eos=args.ignore_eos,
                         batch_size=args.batch_size)


class _Printer:
    """--stream output (README "Streaming"): raw text for one prompt, one line per chunk for several, or
    JSON events; a sequence's end is its result object (JSON) or a "[i] done (reason)" line."""

    def __init__(self, as_json: bool, several: bool) -> None:
        self.as_json, self.several = as_json, several

    def __call__(self, index: int, chunk: str, result) -> None:
        if self.as_json:
            if chunk:
                print(strict_json.dumps({"index": index, "text": chunk}), flush=True)
            if result is not None:
                print(strict_json.dumps({"index": index, "done": True, **result.to_dict()}), flush=True)
        elif self.several:
            if chunk:
                print(f"[{index}] {json.dumps(chunk, ensure_ascii=False)}", flush=True)
            if result is not None:
                print(f"[{index}] done ({result.stats.finish_reason})", flush=True)
        else:
            print(chunk, end="\n" if result is not None else "", flush=True)


def run_generate(args: argparse.Namespace) -> int:
    options = _options(args)
    if args.prompts_file is not None:
        return _run_batch(args, options)
    prompt = _read_prompt(args)
    from megatron_mtp.inference.generate import load_generator

    generator = load_generator(args.model, dtype=args.dtype, assistant=args.assistant)
    printer = _Printer(args.json, several=False) if args.stream else None
    result = generator.generate(prompt, args.max_new_tokens, options=options, on_text=printer)
    if printer is None:  # streamed: already printed
        print(strict_json.dumps(result.to_dict()) if args.json else result.text)
    if args.stats:
        for line in result.stats.summary_lines():
            print(line, file=sys.stderr)
    return 0


def _run_batch(args: argparse.Namespace, options: DecodeOptions) -> int:
    from megatron_mtp.inference.prompts_file import read_prompts_file

    prompts = read_prompts_file(Path(args.prompts_file), args.max_new_tokens)
    from megatron_mtp.inference.generate import load_generator

    generator = load_generator(args.model, dtype=args.dtype, assistant=args.assistant)
    several = len(prompts) > 1
    printer = _Printer(args.json, several) if args.stream else None
    batch = generator.generate_batch([p.prompt for p in prompts], [p.max_new_tokens for p in prompts],
                                     options=options, labels=[p.label for p in prompts], on_text=printer)
    for index, result in enumerate(batch.results if not args.stream else []):  # streamed: already printed
        if args.json:
            print(strict_json.dumps({"index": index, **result.to_dict()}))
        elif several:
            print(f"--- [{index}] ---\n{result.text}")
        else:
            print(result.text)
    if args.json:
        print(strict_json.dumps({"summary": batch.stats.to_dict()}))
    if args.stats:
        for line in batch.stats.summary_lines():
            print(line, file=sys.stderr)
    return 0
