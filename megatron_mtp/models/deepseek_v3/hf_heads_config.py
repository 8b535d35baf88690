"""The Hugging Face-side format of parallel MTP heads (``mtp.style: parallel``): a ``mtp/`` directory of their own,
written by ``convert to-hf`` and read by ``convert from-hf`` and ``megatron-mtp generate``.

There is no Hugging Face format for Gloeckle-style heads: DeepSeek-V3's layers ``num_hidden_layers + d``
are sequential MTP modules (they read the next token's embedding), and every engine that loads them
runs them as such. So ``to-hf`` writes the heads only to ``OUT/mtp/`` beside the standard ``OUT/main/``
and refuses ``--mtp inline``, ``--mtp-layout nextn`` and ``--for ENGINE`` in one sentence each.

``OUT/mtp/config.json``::

    {"architectures": ["DeepseekV3ParallelMTPHeads"], "model_type": "deepseek_v3_parallel_mtp_heads",
     "num_heads": n,                  # head k (1..n) at position t predicts token t+1+k
     "head_input": "main_final_norm", # every head reads the main model's hidden state after model.norm
     "head_layer": "moe" | "dense",   # one DeepSeek-V3 decoder layer shaped like the main model's last
     "head_output": "own_norm_then_main_lm_head",
     "tensor_prefix": "heads.{i}.",   # i = k-1; decoder-layer names of model.layers.N, plus norm.weight
     "main_config": {...},            # the main model's config.json: MLA and MoE shapes of the layers
     "torch_dtype": "bfloat16" | "float32"}

A distinct ``model_type`` keeps transformers' AutoModel and vLLM/SGLang from loading the directory
as something it is not. Tensors: ``heads.{i}.input_layernorm.weight``, ``heads.{i}.self_attn.*``,
``heads.{i}.post_attention_layernorm.weight``, ``heads.{i}.mlp.*`` (as the main model's layer N), and
``heads.{i}.norm.weight``; no embedding or output head (shared with main/, not repeated).
``from-hf`` reads it back bitwise; ``megatron-mtp generate`` drafts with it (inference/parallel_draft.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_config_json import DeepseekV3HFConfig, parse_hf_config

ARCHITECTURE = "DeepseekV3ParallelMTPHeads"
MODEL_TYPE = "deepseek_v3_parallel_mtp_heads"
HEAD_INPUT = "main_final_norm"
HEAD_OUTPUT = "own_norm_then_main_lm_head"
TENSOR_PREFIX = "heads.{i}."


def is_heads_config(raw: Mapping[str, Any]) -> bool:
    """True for the config.json of an exported parallel-heads directory."""
    return ARCHITECTURE in (raw.get("architectures") or []) or raw.get("model_type") == MODEL_TYPE


def head_layer_kind(main: DeepseekV3HFConfig) -> str:
    """'moe' or 'dense': the kind of the main model's last decoder layer, which every head copies."""
    return "moe" if main.is_moe_layer(main.num_hidden_layers - 1) else "dense"


def heads_config(main_config: dict[str, Any], num_heads: int) -> dict[str, Any]:
    """``mtp/config.json`` of ``num_heads`` heads on the model whose config.json is ``main_config``."""
    main = dict(main_config, num_nextn_predict_layers=0)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": MODEL_TYPE,
        "num_heads": int(num_heads),
        "head_input": HEAD_INPUT,
        "head_layer": head_layer_kind(parse_hf_config(main)),
        "head_output": HEAD_OUTPUT,
        "tensor_prefix": TENSOR_PREFIX,
        "main_config": main,
        "torch_dtype": main.get("torch_dtype"),
    }


@dataclass(frozen=True)
class HeadsConfig:
    num_heads: int
    main: DeepseekV3HFConfig
    """The main model's config, as stored beside the heads (their layer shapes)."""


def read_heads_config(raw: Mapping[str, Any], where: str, main: Optional[DeepseekV3HFConfig] = None) -> HeadsConfig:
    """The typed view of a heads ``config.json``; ``main``: the main model it must belong to."""
    for key, want in (("head_input", HEAD_INPUT), ("head_output", HEAD_OUTPUT), ("tensor_prefix", TENSOR_PREFIX)):
        if raw.get(key) != want:
            raise UserError(f"{where}: '{key}' is {raw.get(key)!r}; this version reads parallel MTP heads with "
                            f"{key} {want!r} only")
    count = raw.get("num_heads")
    if not isinstance(count, int) or count < 1:
        raise UserError(f"{where}: 'num_heads' must be a positive integer, not {count!r}")
    if not isinstance(raw.get("main_config"), dict):
        raise UserError(f"{where}: 'main_config' (the main model's config.json) is missing")
    stored = parse_hf_config(raw["main_config"], f"{where} main_config")
    if raw.get("head_layer") != head_layer_kind(stored):
        raise UserError(f"{where}: 'head_layer' is {raw.get('head_layer')!r} but the main model's last layer is "
                        f"{head_layer_kind(stored)}")
    if main is not None and (main.num_hidden_layers, main.hidden_size, main.vocab_size) != (
            stored.num_hidden_layers, stored.hidden_size, stored.vocab_size):
        raise UserError(f"{where} belongs to a different main model (num_hidden_layers, hidden_size or vocab_size "
                        "differ); export main and mtp from the same checkpoint")
    return HeadsConfig(num_heads=count, main=stored)
