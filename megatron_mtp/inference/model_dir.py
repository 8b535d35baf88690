"""Finding and loading an exported Hugging Face directory for decoding (any family of models/family.py).

Accepted layouts:
- ``DIR/main/`` (standard HF dir, no MTP) plus optional ``DIR/mtp/`` holding only
  ``model.layers.{L+i}.*`` with its own config.json (``num_nextn_predict_layers = D``);
- an "inline" dir (official release layout): main and ``model.layers.{L+i}.*`` together;
- a plain HF dir without MTP weights (a config may still claim ``num_nextn_predict_layers``:
  transformers writes 1 by default — the weights decide, not the config).
MTP module i lives at HF layer index ``L + i`` (L = ``num_hidden_layers``), computed, never literal.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

import torch
from torch import nn

from megatron_mtp.checkpoint.finite import refuse_nonfinite, tensor_is_finite
from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.fp8 import is_block_fp8
from megatron_mtp.hf_dir.safetensors_io import HFDir
from megatron_mtp.inference.decoder import family_for
from megatron_mtp.inference.mtp_module import MTPParts, mtp_module
from megatron_mtp.inference.target import TargetModel
from megatron_mtp.models.decoding.layers import HFConfig
from megatron_mtp.models.family import family_of_hf_config, supported_text

_DTYPES = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16, "bf16": torch.bfloat16,
           "float16": torch.float16, "fp16": torch.float16}
_FP32_SUFFIXES = ("mlp.gate.weight", "mlp.gate.e_score_correction_bias", "indexer.weights_proj.weight")


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in _DTYPES:
        raise UserError(f"dtype {dtype!r} is not supported; use one of float32, bfloat16, float16.")
    return _DTYPES[dtype]


@dataclass(frozen=True)
class ExportDirs:
    """Where the main weights, the MTP weights and the tokenizer of an HF export live."""

    root: Path
    main_dir: Path
    mtp_dir: Path | None  # None: no separate MTP part (inline or none)
    tokenizer_file: Path | None


def find_export_dirs(path: str | Path) -> ExportDirs:
    """The directories of the export at ``path`` (main/ + mtp/, inline or plain); a UserError names what is missing."""
    root = Path(path).expanduser()
    if not root.exists():
        raise UserError(
            f"model directory {root} does not exist; pass an exported Hugging Face directory of "
            f"{supported_text(decoding=True)}."
        )
    if not root.is_dir():
        raise UserError(
            f"model path {root} is not a directory; pass an exported Hugging Face directory of "
            f"{supported_text(decoding=True)}."
        )
    if (root / "main" / "config.json").is_file():
        main_dir = root / "main"
        mtp_dir = root / "mtp" if (root / "mtp" / "config.json").is_file() else None
    elif (root / "config.json").is_file():
        main_dir, mtp_dir = root, None
    else:
        raise UserError(
            f"{root} has neither config.json nor main/config.json; pass an exported Hugging Face directory of "
            f"{supported_text(decoding=True)} (or a megatron-mtp checkpoint/run directory)."
        )
    tokenizer_file = None
    for candidate in (main_dir, root, mtp_dir):
        if candidate is not None and (candidate / "tokenizer.json").is_file():
            tokenizer_file = candidate / "tokenizer.json"
            break
    return ExportDirs(root=root, main_dir=main_dir, mtp_dir=mtp_dir, tokenizer_file=tokenizer_file)


def _expert_sources(key: str, prefix: str, num_experts: int) -> list[list[str]] | None:
    """HF per-expert tensor names that make up a stacked expert weight, or None if not stacked."""
    stacked_names = (("mlp.experts.gate_up_proj", ("gate_proj", "up_proj")), ("mlp.experts.down_proj", ("down_proj",)))
    for stacked, parts in stacked_names:
        if key.endswith(stacked):
            base = prefix + key[: -len("gate_up_proj" if parts[0] == "gate_proj" else "down_proj")]
            return [[f"{base}{e}.{part}.weight" for part in parts] for e in range(num_experts)]
    return None


def _load_into(module: nn.Module, weights: HFDir, prefix: str, dtype: torch.dtype, num_experts: int,
               aliases: dict[str, str] | None = None,
               rename: Callable[[str], Optional[str]] = lambda name: name) -> None:
    """Load ``module`` from HF names (``prefix`` + its keys, through the family's ``rename`` of MTP
    tensors); stacked expert weights are assembled from per-expert tensors."""
    aliases = aliases or {}
    plan: dict[str, list[list[str]]] = {}
    stacked: set[str] = set()
    for key in module.state_dict():
        per_expert = _expert_sources(key, prefix, num_experts)
        name = rename(prefix + key) or prefix + key
        if name in weights:
            plan[key] = [[name]]
        elif key in aliases and prefix + aliases[key] in weights:
            plan[key] = [[prefix + aliases[key]]]
        elif per_expert is not None:
            plan[key] = [[rename(part) for part in group] for group in per_expert]
            stacked.add(key)
        else:
            plan[key] = [[name]]
    names = [name for sources in plan.values() for group in sources for name in group]
    missing = [name for name in names if name not in weights]
    if missing:
        shown = ", ".join(missing[:3])
        raise UserError(
            f"{weights.path} lacks {len(missing)} tensor(s) the model needs (e.g. {shown}); re-export the model."
        )
    loaded = {}
    for name in names:
        tensor = weights.get(name)
        if not tensor_is_finite(tensor):
            refuse_nonfinite(name, f"model directory {weights.path}")
        loaded[name] = tensor.to(torch.float32 if name.endswith(_FP32_SUFFIXES) else dtype)
    state = {}
    for key, sources in plan.items():
        if key in stacked:
            state[key] = torch.stack([torch.cat([loaded[name] for name in group]) for group in sources])
        else:
            state[key] = loaded[sources[0][0]]
    module.load_state_dict(state, strict=True, assign=True)


def decodable_config(raw: dict, where: Path) -> HFConfig:
    """The HF config of a model this decoder runs (its family picks the view); what it cannot run is
    one sentence each."""
    family = family_for(raw, where)
    config = family.hf_view(raw, str(where))
    quant = config.quantization_config
    if quant and not is_block_fp8(quant):
        raise UserError(f"{where}: quantization_config {quant} is not DeepSeek's FP8 block format "
                        "(quant_method fp8, fmt e4m3, weight_block_size [rows, cols]); export it in bf16 or fp8.")
    if config.scoring_func not in ("sigmoid", "softmax") or (config.scoring_func == "softmax" and config.n_group > 1):
        raise UserError(f"{where}: scoring_func {config.scoring_func!r} with n_group {config.n_group} is not "
                        "supported; "
                        "the decoder routes with sigmoid scores (DeepSeek-V3's noaux_tc) or softmax top-k without "
                        "expert groups (Qwen3-MoE's).")
    if getattr(config, "hidden_act", "silu") != "silu":  # a family with its own layer checks its activation there
        raise UserError(f"{where}: only hidden_act 'silu' is supported.")
    if config.n_routed_experts and not 1 <= config.topk_group <= config.n_group:
        raise UserError(f"{where}: n_group ({config.n_group}) and topk_group ({config.topk_group}) must satisfy "
                        "1 <= topk_group <= n_group; fix them in config.json.")
    if config.n_routed_experts and config.n_routed_experts % config.n_group:
        raise UserError(f"{where}: n_routed_experts ({config.n_routed_experts}) is not a multiple of n_group "
                        f"({config.n_group}); the router splits the experts into equal groups.")
    return config


def load_target(dirs: ExportDirs, dtype: torch.dtype) -> tuple[TargetModel, HFDir]:
    """Build the main model from ``dirs.main_dir``."""
    weights = HFDir(dirs.main_dir)
    config = decodable_config(weights.config, weights.path / "config.json")
    with torch.device("meta"):
        model = TargetModel(config)
    aliases = {"lm_head.weight": "model.embed_tokens.weight"} if config.tie_word_embeddings else {}
    _load_into(model, weights, "", dtype, config.n_routed_experts, aliases)
    model.eval()
    return model, weights


def mtp_prefixes(config: HFConfig, depth: int) -> list[str]:
    """The release names' prefix of each MTP module (``model.layers.{L+i}.``; the family's table renames them)."""
    return [f"model.layers.{config.num_hidden_layers + i}." for i in range(depth)]


def mtp_renamer(config: HFConfig) -> Callable[[str], Optional[str]]:
    """Release MTP name -> the name in an export of this family (its table's ``mtp_names``; None: not written)."""
    names = family_of_hf_config({"model_type": config.model_type}).table.mtp_names
    return lambda name: names(name, config.num_hidden_layers)


def load_mtp_modules(
    dirs: ExportDirs, target: TargetModel, main_weights: HFDir, dtype: torch.dtype
) -> list[MTPParts]:
    """The MTP modules of an export, in depth order; [] when the export has none."""
    config = target.config
    rename = mtp_renamer(config)
    if dirs.mtp_dir is not None:
        weights = HFDir(dirs.mtp_dir)
        config_path = weights.path / "config.json"
        mtp_config = decodable_config(weights.config, config_path)
        if (type(mtp_config) is not type(config) or mtp_config.num_hidden_layers != config.num_hidden_layers
                or mtp_config.hidden_size != config.hidden_size):
            raise UserError(
                f"{config_path} describes a different model than {dirs.main_dir / 'config.json'} "
                "(model_type, num_hidden_layers or hidden_size differ); export main and mtp from the same checkpoint."
            )
        if mtp_config.num_nextn_predict_layers < 1:
            raise UserError(f"{config_path} states num_nextn_predict_layers < 1; re-export the MTP part.")
        depth = mtp_config.num_nextn_predict_layers
    else:
        weights = main_weights
        depth = 0  # inline: the weights decide (transformers writes num_nextn_predict_layers=1 by default)
        for prefix in mtp_prefixes(config, config.num_nextn_predict_layers):
            if rename(prefix + "eh_proj.weight") not in weights:
                break
            depth += 1
        mtp_config = config
    modules: list[MTPParts] = []
    for i, prefix in enumerate(mtp_prefixes(config, depth)):
        if rename(prefix + "eh_proj.weight") not in weights:
            raise UserError(
                f"{weights.path} lacks {rename(prefix + 'eh_proj.weight')} for MTP depth {i + 1}; re-export the MTP "
                "part."
            )
        with torch.device("meta"):
            module = mtp_module(
                mtp_config,
                config.num_hidden_layers + i,
                own_embedding=rename(prefix + "embed_tokens.weight") in weights,
                own_head=rename(prefix + "shared_head.head.weight") in weights,
            )
        _load_into(module, weights, prefix, dtype, mtp_config.n_routed_experts, rename=rename)
        module.share_with(target.model.embed_tokens, target.lm_head)
        module.eval()
        modules.append(module)
    return modules
