"""An independent PyTorch MTP forward over exported HF weights (the serving engines' equation).

For depth d: tokens shift left by one more position (the last filled with 0, as megatron-core's
roll does), ``h = eh_proj(cat([enorm(embed(tokens)), hnorm(prev_hidden)]))`` -- embedding FIRST --
then one decoder layer of the export's family (transformers' DeepSeek-V3, GLM-4.5 or Qwen3-MoE
implementation, weights loaded by hand), then
``shared_head.norm`` and ``shared_head.head``. ``prev_hidden`` starts as the main model's output
after its final norm and is then the previous depth's normalised output.

Qwen3-MoE exports name the module as SGLang's Qwen3MoeForCausalLMMTP reads it (``mtp.fc``,
``mtp.pre_fc_norm_embedding``, ``mtp.pre_fc_norm_hidden``, ``mtp.layers.0.*``, ``mtp.norm``) and share the
main model's embedding and head: ``_release_names`` spells those literally, independently of the converter.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _load_dir(path: Path) -> dict[str, torch.Tensor]:
    index = json.loads((path / "model.safetensors.index.json").read_text())
    out: dict[str, torch.Tensor] = {}
    for file in sorted(set(index["weight_map"].values())):
        out.update(load_file(str(path / file)))
    return {k: v.float() for k, v in out.items()}


def _layer_state(weights: dict[str, torch.Tensor], prefix: str, experts: int) -> dict[str, torch.Tensor]:
    state = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
    for extra in ("enorm.weight", "hnorm.weight", "eh_proj.weight", "embed_tokens.weight",
                  "shared_head.norm.weight", "shared_head.head.weight"):
        state.pop(extra, None)
    if experts:
        gate_up = [torch.cat([state.pop(f"mlp.experts.{e}.gate_proj.weight"),
                              state.pop(f"mlp.experts.{e}.up_proj.weight")])
                   for e in range(experts)]
        down = [state.pop(f"mlp.experts.{e}.down_proj.weight") for e in range(experts)]
        state["mlp.experts.gate_up_proj"] = torch.stack(gate_up)
        state["mlp.experts.down_proj"] = torch.stack(down)
    return state


SGLANG_QWEN3_MTP = {"pre_fc_norm_embedding.weight": "enorm.weight", "pre_fc_norm_hidden.weight": "hnorm.weight",
                    "fc.weight": "eh_proj.weight", "norm.weight": "shared_head.norm.weight"}
"""SGLang's Qwen3-MoE MTP names (python/sglang/srt/models/qwen3_moe_mtp.py) -> the release's."""


def _release_names(weights: dict[str, torch.Tensor], model, num_layers: int, depth: int) -> dict[str, torch.Tensor]:
    """A Qwen3-MoE export's MTP modules under the release names of layers ``num_layers + d``: module 0 as
    SGLang names it (``mtp.*``), module d >= 1 under ``mtp.{d}.`` with the same sub-names."""
    out = {}
    for d in range(depth):
        p, own = f"model.layers.{num_layers + d}.", "mtp." if d == 0 else f"mtp.{d}."
        out[p + "embed_tokens.weight"] = model.model.embed_tokens.weight
        out[p + "shared_head.head.weight"] = model.lm_head.weight
        for name, tensor in weights.items():
            rest = name[len(own):]
            if name.startswith(own) and not (d == 0 and rest.split(".", 1)[0].isdigit()):
                out[p + SGLANG_QWEN3_MTP.get(rest, rest.replace("layers.0.", "", 1))] = tensor
    return out


def _classes(model_type: str):
    """transformers' causal-LM and decoder-layer classes of a family."""
    if model_type == "qwen3_moe":
        from transformers import Qwen3MoeForCausalLM
        from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeDecoderLayer

        return Qwen3MoeForCausalLM, Qwen3MoeDecoderLayer
    if model_type == "glm4_moe":
        from transformers import Glm4MoeForCausalLM
        from transformers.models.glm4_moe.modeling_glm4_moe import Glm4MoeDecoderLayer

        return Glm4MoeForCausalLM, Glm4MoeDecoderLayer
    from transformers import DeepseekV3ForCausalLM
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3DecoderLayer

    return DeepseekV3ForCausalLM, DeepseekV3DecoderLayer


@torch.no_grad()
def mtp_logits(main_dir: Path, mtp_dir: Path, tokens: torch.Tensor) -> list[torch.Tensor]:
    model_type = json.loads((main_dir / "config.json").read_text())["model_type"]
    model_class, layer_class = _classes(model_type)
    model = model_class.from_pretrained(main_dir, dtype=torch.float32, attn_implementation="eager").eval()
    cfg = model.config
    mtp_cfg = json.loads((mtp_dir / "config.json").read_text())
    L, D = mtp_cfg["num_hidden_layers"], mtp_cfg["num_nextn_predict_layers"]
    weights = _load_dir(mtp_dir)
    if model_type == "qwen3_moe":
        weights = _release_names(weights, model, L, D)
    b, s = tokens.shape
    positions = torch.arange(s).expand(b, s)
    mask = torch.full((s, s), float("-inf")).triu(1).expand(b, 1, s, s)
    hidden = model.model(tokens).last_hidden_state
    ids = tokens.clone()
    outputs = []
    for d in range(D):
        p = f"model.layers.{L + d}."
        ids = torch.roll(ids, -1, dims=-1)
        ids[:, -1] = 0
        emb = F.embedding(ids, weights[p + "embed_tokens.weight"])
        x = torch.cat([_rms(emb, weights[p + "enorm.weight"], cfg.rms_norm_eps),
                       _rms(hidden, weights[p + "hnorm.weight"], cfg.rms_norm_eps)], dim=-1)
        x = x @ weights[p + "eh_proj.weight"].T
        layer = layer_class(cfg, layer_idx=L + d).eval()
        experts = getattr(cfg, "n_routed_experts", None) or getattr(cfg, "num_experts", 0)
        layer.load_state_dict(_layer_state(weights, p, experts), strict=True)
        x = layer(x, attention_mask=mask, position_ids=positions,
                  position_embeddings=model.model.rotary_emb(x, positions))
        hidden = _rms(x, weights[p + "shared_head.norm.weight"], cfg.rms_norm_eps)
        outputs.append(hidden @ weights[p + "shared_head.head.weight"].T)
    return outputs
