"""The speculators format of an EAGLE-3 drafter (speculators 0.9.0's ``Eagle3DraftModel``, which vLLM reads): a
directory with config.json and model.safetensors, both ways.

config.json: ``speculators_model_type: eagle3``, the drafter's decoder layer as a full HF Llama config
(``transformer_layer_config``, its vocab_size the target's), ``draft_vocab_size``, ``target_hidden_size``,
``eagle_aux_hidden_state_layer_ids``, the norm options, and ``speculators_config`` (the eagle3 algorithm, greedy
proposals of ``speculative_tokens`` tokens, the verifier's name_or_path and architectures).

Tensors, as speculators writes them: ``fc.weight``, ``layers.{i}.self_attn.{q,k,v,o}_proj.weight``,
``layers.{i}.mlp.{gate,up,down}_proj.weight`` (our fused ``linear_fc1`` split into gate and up),
``layers.{i}.{input_layernorm,post_attention_layernorm}.weight``, ``layers.0.hidden_norm.weight``, ``norm.weight``,
``lm_head.weight``, ``embed_tokens.weight`` (the target's table, which the drafter reads frozen) and, with a draft
vocabulary smaller than the target's, ``d2t`` (int64 offsets: target id = draft index + d2t) and ``t2d`` (bool over
the target's vocabulary). Our keys are the checkpoint's below ``mtp_eagle3.``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import torch

from megatron_mtp.errors import UserError
from megatron_mtp.mtp_styles.eagle3.shape import DrafterShape

MODEL_TYPE = "eagle3"
WEIGHTS = "model.safetensors"
EMBEDDING = "embed_tokens.weight"
_PLAIN = (  # (ours below layers.{i}., speculators' below layers.{i}.)
    ("input_layernorm.weight", "input_layernorm.weight"), ("hidden_norm.weight", "hidden_norm.weight"),
    ("self_attention.linear_q.weight", "self_attn.q_proj.weight"),
    ("self_attention.linear_k.weight", "self_attn.k_proj.weight"),
    ("self_attention.linear_v.weight", "self_attn.v_proj.weight"),
    ("self_attention.linear_proj.weight", "self_attn.o_proj.weight"),
    ("pre_mlp_layernorm.weight", "post_attention_layernorm.weight"), ("mlp.linear_fc2.weight", "mlp.down_proj.weight"),
)
_TOP = (("fc.weight", "fc.weight"), ("final_layernorm.weight", "norm.weight"), ("lm_head.weight", "lm_head.weight"))
_FC1, _GATE, _UP = "mlp.linear_fc1.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight"


def claims(config: dict[str, Any]) -> bool:
    """A config.json of a speculators EAGLE-3 drafter."""
    return config.get("speculators_model_type") == MODEL_TYPE


def tensor_names(shape: DrafterShape) -> dict[str, tuple[str, ...]]:
    """Our key (below ``mtp_eagle3.``) -> its speculators tensor(s) (gate and up of the fused fc1), for a drafter of
    ``shape``; ``d2t``/``t2d`` only with a draft vocabulary (speculators has none over the whole vocabulary)."""
    out = {mine: (theirs,) for mine, theirs in _TOP}
    for i in range(shape.num_layers):
        out.update({f"layers.{i}.{mine}": (f"layers.{i}.{theirs}",) for mine, theirs in _PLAIN})
        out[f"layers.{i}.{_FC1}"] = (f"layers.{i}.{_GATE}", f"layers.{i}.{_UP}")
    if shape.restricted:
        out["d2t"], out["t2d"] = ("d2t",), ("t2d",)
    return out


def to_speculators(ours: dict[str, torch.Tensor], embedding: torch.Tensor,
                   shape: DrafterShape) -> dict[str, torch.Tensor]:
    """Our drafter's tensors (keys below ``mtp_eagle3.``) and the target's embedding table [V(padded), H] -> the
    speculators tensors."""
    out = {theirs: ours[mine] for mine, theirs in _TOP}
    for i in range(shape.num_layers):
        for mine, theirs in _PLAIN:
            if f"layers.{i}.{mine}" in ours:
                out[f"layers.{i}.{theirs}"] = ours[f"layers.{i}.{mine}"]
        gate, up = ours[f"layers.{i}.{_FC1}"].chunk(2, dim=0)
        out[f"layers.{i}.{_GATE}"], out[f"layers.{i}.{_UP}"] = gate.contiguous(), up.contiguous()
    out[EMBEDDING] = embedding[:shape.vocab]
    if shape.restricted:
        out["d2t"], out["t2d"] = ours["d2t"], ours["t2d"]
    return out


def from_speculators(theirs: dict[str, torch.Tensor], shape: DrafterShape,
                     embedding: Optional[torch.Tensor] = None, where: str = "") -> dict[str, torch.Tensor]:
    """The speculators tensors of a drafter of ``shape`` -> ours (keys below ``mtp_eagle3.``). ``embedding``: the
    target's table, which its ``embed_tokens`` must equal where it has one (our drafter reads the target's)."""
    out = {mine: theirs[t] for mine, t in _TOP}
    for i in range(shape.num_layers):
        for mine, t in _PLAIN:
            if f"layers.{i}.{t}" in theirs:
                out[f"layers.{i}.{mine}"] = theirs[f"layers.{i}.{t}"]
        out[f"layers.{i}.{_FC1}"] = torch.cat([theirs[f"layers.{i}.{_GATE}"], theirs[f"layers.{i}.{_UP}"]], dim=0)
    if shape.restricted:
        out["d2t"], out["t2d"] = theirs["d2t"], theirs["t2d"]
    else:  # the whole vocabulary: identity tables
        out["d2t"] = torch.zeros(shape.vocab, dtype=torch.long)
        out["t2d"] = torch.ones(shape.vocab, dtype=torch.bool)
    if embedding is not None and EMBEDDING in theirs and not torch.equal(  # in the precision it was written in
            theirs[EMBEDDING], embedding[:shape.vocab].to(theirs[EMBEDDING].dtype)):
        raise UserError(f"{where}: its embed_tokens.weight is not the target's embedding table, which the drafter "
                        "reads here; export it from a drafter trained for this target")
    return out


def speculators_config(shape: DrafterShape, speculative_tokens: int, dtype: str, max_positions: int,
                       verifier: Optional[str], architectures: list[str]) -> dict[str, Any]:
    """config.json of the drafter (module note); ``dtype`` float32 or bfloat16."""
    layer = {
        "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
        "head_dim": shape.head_dim, "hidden_act": "silu", "hidden_size": shape.hidden,
        "intermediate_size": shape.ffn, "max_position_embeddings": max_positions, "mlp_bias": False,
        "model_type": "llama", "num_attention_heads": shape.heads, "num_hidden_layers": shape.num_layers,
        "num_key_value_heads": shape.groups, "rms_norm_eps": shape.eps, "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "tie_word_embeddings": False, "vocab_size": shape.vocab,
    }
    return {
        "architectures": ["Eagle3DraftModel"], "speculators_model_type": MODEL_TYPE, "dtype": dtype,
        "draft_vocab_size": shape.draft_vocab, "target_hidden_size": shape.hidden,
        "eagle_aux_hidden_state_layer_ids": list(shape.aux_layers), "embed_requires_grad": False,
        "norm_before_residual": shape.norm_before_residual, "norm_before_fc": False, "fc_norm": False,
        "norm_output": shape.norm_output, "tie_word_embeddings": False, "transformer_layer_config": layer,
        "speculators_config": {
            "algorithm": MODEL_TYPE, "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": speculative_tokens,
                                  "accept_tolerance": 0.0, "verifier_accept_k": 1}],
            "verifier": {"name_or_path": verifier, "architectures": architectures},
        },
    }


def shape_fields(config: dict[str, Any], where: str) -> dict[str, Any]:
    """The run config fields a speculators EAGLE-3 config.json describes: ``mtp.eagle3.*`` and ``mtp.num_layers``
    (its speculative tokens), one sentence for what our drafter does not build."""
    if not claims(config):
        raise UserError(f"{where}: speculators_model_type is {config.get('speculators_model_type')!r}, not "
                        f"{MODEL_TYPE!r}")
    layer = config.get("transformer_layer_config") or {}
    refused = [f"transformer_layer_config.model_type={layer.get('model_type')!r} (llama is built)"
               if layer.get("model_type") != "llama" else None,
               "norm_before_fc" if config.get("norm_before_fc") else None, "fc_norm" if config.get("fc_norm") else None,
               "attention_bias" if layer.get("attention_bias") else None, "mlp_bias" if layer.get("mlp_bias") else None,
               f"hidden_act={layer.get('hidden_act')!r}" if layer.get("hidden_act", "silu") != "silu" else None,
               "a rope_type other than default" if (layer.get("rope_parameters") or {}).get(
                   "rope_type", "default") != "default" else None,
               "target_hidden_size other than its hidden_size" if config.get("target_hidden_size") not in (
                   None, layer.get("hidden_size")) else None]
    refused = [r for r in refused if r]
    if refused:
        raise UserError(f"{where}: this EAGLE-3 drafter has {', '.join(refused)}, which mtp.style=eagle3 does not "
                        "build yet")
    heads = layer["num_attention_heads"]
    methods = config.get("speculators_config", {}).get("proposal_methods") or [{}]
    return {
        "mtp.num_layers": int(methods[0].get("speculative_tokens") or 3),
        "mtp.eagle3.aux_layers": list(config["eagle_aux_hidden_state_layer_ids"]),
        "mtp.eagle3.num_layers": layer["num_hidden_layers"], "mtp.eagle3.num_attention_heads": heads,
        "mtp.eagle3.num_query_groups": layer.get("num_key_value_heads") or heads,
        "mtp.eagle3.head_dim": layer.get("head_dim") or layer["hidden_size"] // heads,
        "mtp.eagle3.ffn_hidden_size": layer["intermediate_size"],
        "mtp.eagle3.draft_vocab_size": config["draft_vocab_size"],
        "mtp.eagle3.norm_before_residual": bool(config.get("norm_before_residual")),
        "mtp.eagle3.norm_output": bool(config.get("norm_output")),
    }


def shape_of(config: dict[str, Any], where: str = "config.json") -> DrafterShape:
    """The drafter a speculators EAGLE-3 config.json describes (checked as ``shape_fields`` checks it)."""
    fields = shape_fields(config, where)
    layer = config["transformer_layer_config"]
    rope = layer.get("rope_parameters") or {}
    e = {k.split(".")[-1]: v for k, v in fields.items() if k.startswith("mtp.eagle3.")}
    return DrafterShape(
        hidden=layer["hidden_size"], target_layers=max(e["aux_layers"]), aux_layers=tuple(e["aux_layers"]),
        num_layers=e["num_layers"], heads=e["num_attention_heads"], groups=e["num_query_groups"],
        head_dim=e["head_dim"], ffn=e["ffn_hidden_size"], vocab=layer["vocab_size"], draft_vocab=e["draft_vocab_size"],
        eps=layer.get("rms_norm_eps", 1e-6), rope_theta=float(rope.get("rope_theta", layer.get("rope_theta", 1e4))),
        norm_before_residual=e["norm_before_residual"], norm_output=e["norm_output"], step_loss_decay=1.0,
        train_lm_head=False)


def write_dir(out: Path, config: dict[str, Any], tensors: dict[str, torch.Tensor], dtype: torch.dtype) -> Path:
    """config.json and model.safetensors in ``out`` (floating tensors cast to ``dtype``, the tables as they are)."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    cast = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous() for k, v in tensors.items()}
    save_file(cast, str(out / WEIGHTS), metadata={"format": "pt"})
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out


def read_dir(path: Path) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """(config.json, tensors) of a speculators drafter directory (one safetensors file or an index of several)."""
    from safetensors.torch import load_file

    where = Path(path)
    try:
        config = json.loads((where / "config.json").read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{where}: no readable config.json ({exc})") from None
    files = sorted(where.glob("*.safetensors"))
    if not files:
        raise UserError(f"{where}: no .safetensors file")
    tensors: dict[str, torch.Tensor] = {}
    for file in files:
        tensors.update(load_file(str(file)))
    return config, tensors
