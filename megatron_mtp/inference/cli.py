"""``megatron-mtp generate``: plain or MTP-speculative generation from an exported model.

Only parses arguments; torch and the model code are imported inside :func:`run_generate`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from megatron_mtp import strict_json
from megatron_mtp.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "generate",
        help="generate text, optionally with MTP speculative decoding",
        description="Generate from an exported Hugging Face directory of a DeepSeek-V3 (deepseek_v3) or "
        "GLM-4.5/4.6/4.7 (glm4_moe) model (main/ + mtp/, inline, or plain; the MTP layers draft) or from a "
        "megatron-mtp checkpoint/run directory (exported on the fly).",
    )
    parser.add_argument("model", help="exported model directory, or a megatron-mtp checkpoint/run directory")
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", help="prompt text")
    source.add_argument("--prompt-file", help="file whose whole content is the prompt")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="most tokens to generate (default 64)")
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-k", type=int, default=0, help="keep the k most likely tokens (0 = off)")
    parser.add_argument("--top-p", type=float, default=1.0, help="nucleus sampling mass (1 = off)")
    parser.add_argument("--seed", type=int, default=0, help="random seed for sampling (default 0)")
    parser.add_argument("--speculative", type=int, default=0, metavar="K",
                        help="draft K tokens per step with the MTP module(s) (0 = plain decoding)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    parser.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS token")
    parser.add_argument("--dtype", default="float32", help="float32 (default), bfloat16 or float16")
    parser.add_argument("--stats", action="store_true", help="print decoding statistics to stderr")
    parser.add_argument("--json", action="store_true", help="print one JSON object with text, tokens and stats")
    parser.set_defaults(func=run_generate)


def _read_prompt(args: argparse.Namespace) -> str:
    if args.prompt is not None:
        return str(args.prompt)
    path = Path(args.prompt_file)
    if not path.is_file():
        raise UserError(f"prompt file {path} does not exist; pass an existing file to --prompt-file.")
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"prompt file {path} cannot be read as UTF-8 text ({exc}).") from exc


def run_generate(args: argparse.Namespace) -> int:
    if args.speculative < 0:
        raise UserError(f"--speculative must be >= 0 (got {args.speculative}); use 0 for plain decoding.")
    prompt = _read_prompt(args)
    from megatron_mtp.inference.generate import load_generator

    generator = load_generator(args.model, dtype=args.dtype)
    result = generator.generate(
        prompt,
        max_new_tokens=args.max_new_tokens,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        speculative_k=args.speculative,
        stop=args.stop,
        ignore_eos=args.ignore_eos,
    )
    if args.json:
        print(strict_json.dumps(result.to_dict()))
    else:
        print(result.text)
    if args.stats:
        for line in result.stats.summary_lines():
            print(line, file=sys.stderr)
    return 0
