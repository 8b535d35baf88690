"""The Hugging Face-side format of parallel MTP heads (``mtp.style: parallel``): a ``mtp/`` directory of their own,
written by ``convert to-hf`` and read by ``convert from-hf`` and ``megatron-mtp generate``, for any family that
builds heads (DeepSeek-V3, Gemma 4).

There is no Hugging Face format for Gloeckle-style heads: a release's layers ``num_hidden_layers + d``
are sequential MTP modules (they read the next token's embedding), and every engine that loads them
runs them as such. So ``to-hf`` writes the heads only to ``OUT/mtp/`` beside the standard ``OUT/main/``
and refuses ``--mtp inline``, ``--mtp-layout nextn`` and ``--for ENGINE`` in one sentence each.

``OUT/mtp/config.json`` (``Family`` is the main model's architecture without ``ForCausalLM``)::

    {"architectures": ["{Family}ParallelMTPHeads"], "model_type": "{main model_type}_parallel_mtp_heads",
     "num_heads": n,                  # head k (1..n) at position t predicts token t+1+k
     "head_input": "main_final_norm", # every head reads the main model's hidden state after model.norm
     "head_layer": "moe" | "dense",   # one decoder layer of the family, shaped as its MTP layer would be
     "head_output": "own_norm_then_main_lm_head",
     "tensor_prefix": "heads.{i}.",   # i = k-1; decoder-layer names of model.layers.N, plus norm.weight
     "main_config": {...},            # the main model's config.json: the layers' shapes
     "torch_dtype": "bfloat16" | "float32"}

A distinct ``model_type`` keeps transformers' AutoModel and vLLM/SGLang from loading the directory
as something it is not. Tensors: ``heads.{i}.`` + the names of a decoder layer of the main model
(DeepSeek-V3: ``self_attn.*``, ``mlp.*``, the two layer norms; Gemma 4: its sandwich norms, ``router.*``,
``experts.*`` and ``layer_scalar``), and ``heads.{i}.norm.weight``; no embedding or output head (shared
with main/, not repeated). ``from-hf`` reads it back bitwise; ``megatron-mtp generate`` drafts with it
(mtp_styles/parallel/drafter.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.errors import UserError

HEAD_INPUT = "main_final_norm"
HEAD_OUTPUT = "own_norm_then_main_lm_head"
TENSOR_PREFIX = "heads.{i}."
_ARCH_SUFFIX, _TYPE_SUFFIX = "ParallelMTPHeads", "_parallel_mtp_heads"


def is_heads_config(raw: Mapping[str, Any]) -> bool:
    """True for the config.json of an exported parallel-heads directory."""
    return (any(str(a).endswith(_ARCH_SUFFIX) for a in raw.get("architectures") or [])
            or str(raw.get("model_type", "")).endswith(_TYPE_SUFFIX))


def _main_model(main_config: Mapping[str, Any], where: str):
    """The model config of a main model's config.json (its family's reading)."""
    from megatron_mtp.models.family import family_of_hf_config

    return family_of_hf_config(main_config, where).from_hf_config(main_config, where)[0]


def _head_layer_kind(model) -> str:
    """'moe' or 'dense': the kind of layer every head is (the family's MTP layer's, tensor_table.mtp_is_moe)."""
    from megatron_mtp.models.tensor_table import mtp_is_moe

    return "moe" if mtp_is_moe(model) else "dense"


def heads_config(main_config: dict[str, Any], num_heads: int) -> dict[str, Any]:
    """``mtp/config.json`` of ``num_heads`` heads on the model whose config.json is ``main_config``."""
    main = dict(main_config, num_nextn_predict_layers=0)
    arch = str((main.get("architectures") or ["Model"])[0]).removesuffix("ForCausalLM")
    return {
        "architectures": [arch + _ARCH_SUFFIX],
        "model_type": f"{main['model_type']}{_TYPE_SUFFIX}",
        "num_heads": int(num_heads),
        "head_input": HEAD_INPUT,
        "head_layer": _head_layer_kind(_main_model(main, "main_config")),
        "head_output": HEAD_OUTPUT,
        "tensor_prefix": TENSOR_PREFIX,
        "main_config": main,
        "torch_dtype": main.get("torch_dtype"),
    }


@dataclass(frozen=True)
class HeadsConfig:
    num_heads: int
    main_config: dict[str, Any]
    """The main model's config.json, as stored beside the heads (their layer shapes)."""


def read_heads_config(raw: Mapping[str, Any], where: str, main: Optional[Mapping[str, Any]] = None) -> HeadsConfig:
    """The typed view of a heads ``config.json``; ``main``: the config.json of the main model it must belong to."""
    for key, want in (("head_input", HEAD_INPUT), ("head_output", HEAD_OUTPUT), ("tensor_prefix", TENSOR_PREFIX)):
        if raw.get(key) != want:
            raise UserError(f"{where}: '{key}' is {raw.get(key)!r}; this version reads parallel MTP heads with "
                            f"{key} {want!r} only")
    count = raw.get("num_heads")
    if not isinstance(count, int) or count < 1:
        raise UserError(f"{where}: 'num_heads' must be a positive integer, not {count!r}")
    if not isinstance(raw.get("main_config"), dict):
        raise UserError(f"{where}: 'main_config' (the main model's config.json) is missing")
    stored = dict(raw["main_config"])
    ours = _main_model(stored, f"{where} main_config")
    kind = _head_layer_kind(ours)
    if raw.get("head_layer") != kind:
        raise UserError(f"{where}: 'head_layer' is {raw.get('head_layer')!r} but the main model's MTP layer is {kind}")
    if main is not None:
        theirs = _main_model(main, "the main model")
        if any(getattr(ours, f) != getattr(theirs, f) for f in ("num_layers", "hidden_size", "vocab_size")):
            raise UserError(f"{where} belongs to a different main model (its layers, hidden size or vocabulary "
                            "differ); export main and mtp from the same checkpoint")
    return HeadsConfig(num_heads=count, main_config=stored)
