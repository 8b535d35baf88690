"""Hugging Face directory of a model family (DeepSeek-V3/V2, GLM-4.5, Qwen3-MoE, Gemma 4) -> megatron-mtp
torch_dist checkpoint (layout-free).
The family is config.json's ``model_type`` (models/family.py ``family_of_hf_config``).

Inputs: one HF directory (main only, or the release layout with MTP layers inline), a separate
export (``DIR/main`` + ``DIR/mtp``), or ``mtp_dir`` given explicitly (release or SGLang NextN
naming, or the format of another MTP style, which claims the directory: mtp_styles/<name>/convert.py);
weights in bf16/fp16/fp32 or DeepSeek's FP8 release format (dequantised per 128x128 block).

Output ``OUT`` is one self-contained checkpoint directory: torch_dist files holding only model
weights with the trainer's keys (TE spelling of fused norms, used on every platform), written at
TP1/PP1/EP1 as global tensors, so the trainer loads it at any layout; ``config.yaml`` (the
translated model, the requested parallel layout), ``tokenizer/`` and ``train_state.json`` with
``has_optimizer: false`` (start from its weights with ``checkpoint.load=OUT``, or evaluate it with
``megatron-mtp eval OUT``), and ``hf_source/`` with the source's config.json and generation_config.json
(``to-hf`` writes back what still holds of them; convert/hf_source.py).
Streaming: one mcore tensor (routed experts: one expert) is assembled and written at a time.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from megatron_mtp.checkpoint.finite import refuse_nonfinite, tensor_is_finite
from megatron_mtp.checkpoint.info import train_state_record, write_checkpoint_info
from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR
from megatron_mtp.checkpoint.torch_dist_writer import TorchDistWriter
from megatron_mtp.config import Config
from megatron_mtp.config.base import apply_override
from megatron_mtp.config.model import MTPConfig
from megatron_mtp.config.mtp_style import get_style, style_of_mtp_dir
from megatron_mtp.config.root import config_from_dict
from megatron_mtp.config.validate import check_family
from megatron_mtp.convert.drafter_dir import table_name
from megatron_mtp.convert.hf_source import record_source
from megatron_mtp.convert.progress import Progress
from megatron_mtp.convert.shapes import check_shape
from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import HFDir
from megatron_mtp.hf_dir.tokenizer_files import TOKENIZER_FILES
from megatron_mtp.models.family import family_of_hf_config
from megatron_mtp.models.tensor_table import Param, extra_state_keys, is_mtp_hf_name
from megatron_mtp.models.tensor_transforms import Copy
from megatron_mtp.output import staged_dir, tree_bytes

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class _Sources:
    """HF tensor names -> (directory, name there), over a main dir and an optional MTP dir (whose MTP
    tensors replace any the main dir holds inline: a new draft paired with an unchanged release)."""

    def __init__(self, main: HFDir, mtp: Optional[HFDir], num_layers: int, rename=None, drafter: bool = False
                 ) -> None:
        self.dirs = {"main": main}
        self.where: dict[str, tuple[str, str]] = {}
        self.left_out: list[str] = []
        """Tensors of the main directory the family's ``import_names`` leaves out (a multimodal model's towers)."""
        for n in main.names():
            ours = rename(n) if rename is not None else n
            if ours is None:
                self.left_out.append(n)
            else:
                self.where[ours] = ("main", n)
        self.replaced: set[int] = set()
        """MTP modules (0-based) the main directory holds inline and the MTP directory replaces."""
        if mtp is not None and drafter:  # a separate drafter's own tensors (convert/drafter_dir.py)
            self.dirs["mtp"] = mtp
            self.where.update({table_name(name): ("mtp", name) for name in mtp.names()})
        elif mtp is not None:
            self.dirs["mtp"] = mtp
            nextn = any(str(a).endswith("NextN") for a in mtp.config.get("architectures") or [])
            for name in mtp.names():
                release = name
                if nextn and name.startswith("model.layers."):
                    _, _, index, rest = name.split(".", 3)
                    release = f"model.layers.{int(index) + num_layers}.{rest}"
                if self.where.get(release, ("",))[0] == "main" and is_mtp_hf_name(release, num_layers):
                    self.replaced.add(int(release.split(".", 3)[2]) - num_layers)
                self.where[release] = ("mtp", name)  # the MTP directory's draft wins over one inline in main

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def get(self, name: str) -> torch.Tensor:
        d, n = self.where[name]
        return self.dirs[d].get(n)

    def shape(self, name: str) -> tuple[int, ...]:
        d, n = self.where[name]
        return self.dirs[d].shape(n)


def _open_inputs(hf_dir: Path, mtp_dir: Optional[Path]) -> tuple[HFDir, Optional[HFDir]]:
    if (hf_dir / "main" / "config.json").is_file() and not (hf_dir / "config.json").exists():
        if mtp_dir is None and (hf_dir / "mtp" / "config.json").is_file():
            mtp_dir = hf_dir / "mtp"
        hf_dir = hf_dir / "main"
    main, mtp = HFDir(hf_dir), HFDir(mtp_dir) if mtp_dir is not None else None
    # a draft of another model would only show up as missing or left-over tensors (a separate drafter's shape is
    # checked against the model where its style reads it); a style's own format has a model_type of its own
    style = style_of_mtp_dir(mtp.config) if mtp is not None else None
    if style is not None and not style.separate_drafter:
        keys = ("hidden_size", "vocab_size") + (("model_type",) if style.hf_inline else ())
        for key in keys:
            if key in mtp.config and mtp.config.get(key) != main.config.get(key):
                raise UserError(f"the MTP directory '{mtp.path}' has {key} {mtp.config.get(key)!r} but the model "
                                f"'{main.path}' has {main.config.get(key)!r}; pass the MTP directory of this model")
    return main, mtp


def _vocab_multiple(vocab: int, tp: int) -> int:
    if vocab % tp:
        raise UserError(f"vocabulary size {vocab} is not divisible by --tp {tp}; choose a TP size that divides it")
    return math.gcd(vocab // tp, 128)


def _shape_of(param: Param, src: _Sources) -> tuple[int, ...]:
    names = [n.format(e=0) for n in param.hf]
    shapes = [src.shape(n) for n in names]
    if len(shapes) > 1:
        if not param.transform.interleaved and shapes[0] != shapes[1]:
            raise UserError(f"'{names[0]}' {shapes[0]} and '{names[1]}' {shapes[1]} must have the same shape")
        if any(s[1:] != shapes[0][1:] for s in shapes):
            raise UserError(f"{', '.join(names)} must have the same shape past their first dimension, not {shapes}")
        rows = (sum(s[0] for s in shapes), *shapes[0][1:])
        if param.transform.part_rows(rows[0]) != [s[0] for s in shapes]:
            raise UserError(f"{', '.join(names)} have {[s[0] for s in shapes]} rows, which the config.json's heads "
                            "do not imply (config/weights mismatch)")
    else:
        rows = shapes[0]
    return (param.num_experts, *rows) if param.per_expert else tuple(rows)


def _assemble(param: Param, src: _Sources, dtype: torch.dtype, expert: Optional[int]) -> torch.Tensor:
    names = [n.format(e=expert) for n in param.hf] if expert is not None else list(param.hf)
    parts = [src.get(n) for n in names]
    for name, part in zip(names, parts):
        if not tensor_is_finite(part):
            refuse_nonfinite(name, "the Hugging Face model")
    parts = [part.to(param.transform.dtype(dtype)) for part in parts]
    tensor = param.transform.from_hf(parts)
    return tensor.unsqueeze(0) if expert is not None else tensor


_FROM_HF_KEYS = ("model.", "mtp.num_layers", "mtp.style")
"""Overrides the HF directory decides (its config.json and MTP tensors)."""


def _written_config(name: str, model_cfg, mtp: MTPConfig, overrides: Sequence[str], vocab: int) -> Config:
    """The config written beside the imported weights: the HF model and MTP shape, then ``overrides``;
    the vocabulary is padded for the chosen tensor-parallel size."""
    data = Config(name=name, model=model_cfg, mtp=mtp).to_dict()
    for override in overrides:
        key = override.split("=", 1)[0].strip()
        if key.startswith(_FROM_HF_KEYS):
            raise UserError(f"override '{override}': {key} comes from the Hugging Face config.json and weights; "
                            "set training, parallel, data and the other sections here, or edit the model after import")
        apply_override(data, Config, override)
    cfg = config_from_dict(data)
    if cfg.model.num_experts and cfg.model.num_experts % cfg.parallel.expert:
        raise UserError(f"parallel.expert={cfg.parallel.expert} does not divide the {cfg.model.num_experts} routed "
                        "experts")
    cfg.model.make_vocab_size_divisible_by = _vocab_multiple(vocab, cfg.parallel.tensor)
    check_family(cfg)
    return cfg


def import_from_hf(
    hf_dir: str | Path,
    out_dir: str | Path,
    mtp_dir: Optional[str | Path] = None,
    with_mtp: bool = True,
    dtype: str = "fp32",
    overrides: Sequence[str] = (),
) -> Path:
    """Convert an HF model of a registered family into a megatron-mtp checkpoint directory ``out_dir``;
    ``overrides`` (dotted, as `train` takes them) set the training config written beside the weights
    (``parallel.tensor=2``, ``optimizer.lr=1e-4``, ...); the model and MTP shape come from the HF config."""
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be fp32 or bf16, not '{dtype}'")
    hf_dir = Path(hf_dir)
    if not hf_dir.is_dir():
        raise UserError(f"Hugging Face directory '{hf_dir}' does not exist")
    main, mtp = _open_inputs(hf_dir, Path(mtp_dir) if mtp_dir is not None else None)
    family = family_of_hf_config(main.config, str(main.path / "config.json"))
    model_cfg, _, vocab = family.from_hf_config(main.config, str(main.path / "config.json"))
    param_table = family.param_table
    style = style_of_mtp_dir(mtp.config if mtp is not None else None)  # the MTP directory's format
    depth = style.convert().import_depth(main, mtp, with_mtp)
    if not style.hf_inline and not with_mtp:
        mtp = None  # its tensors are not model.layers.* names that --no-mtp would recognise
    mtp_cfg = MTPConfig(num_layers=depth, style=style.name if depth else MTPConfig.style)
    if depth:
        style.convert().import_shape(mtp_cfg, mtp, model_cfg, vocab)
    cfg = _written_config(f"from_hf_{hf_dir.name}", model_cfg, mtp_cfg, overrides, vocab)
    model_cfg = cfg.model
    rename = family.import_names(main.config) if family.import_names is not None else None
    src = _Sources(main, mtp, model_cfg.num_layers, rename, drafter=style.separate_drafter)
    if src.left_out:
        towers = sorted({".".join(n.split(".")[:2]) for n in src.left_out})
        print(f"note: '{main.path}' is a multimodal {family.title} checkpoint; its text model is imported and "
              f"{len(src.left_out)} tensors of {', '.join(towers)} are left out", file=sys.stderr, flush=True)
    if src.replaced and with_mtp:
        layers = ", ".join(f"model.layers.{model_cfg.num_layers + d}" for d in sorted(src.replaced))
        print(f"note: '{main.path}' holds MTP weights inline ({layers}); the MTP directory '{mtp.path}' replaces "
              "them", file=sys.stderr, flush=True)
    # the trainer writes TE spellings on every platform
    drafter = get_style(cfg.mtp.style).convert().drafter_params(cfg, vocab)  # its copies of target tensors: not read
    params = (param_table(model_cfg, depth, spec="te", mtp_copies=False, style=cfg.mtp.style)
              + [p for p in drafter if not isinstance(p.transform, Copy)])
    for p in params:
        for name in p.hf_names():
            if name not in src:
                what = "MTP layer" if p.part == "mtp" else "model"
                raise UserError(
                    f"'{name}' is missing from '{hf_dir}' although its config.json describes this {what} "
                    "(config/weights mismatch or an incomplete download)"
                )
    used = {n for p in params for n in p.hf_names()}
    mtp_copies = {n for p in param_table(model_cfg, depth, style=cfg.mtp.style) + drafter
                  if isinstance(p.transform, Copy) for n in p.hf_names()}
    for name in src.where:
        if name in used or name in mtp_copies:
            continue
        if not with_mtp and is_mtp_hf_name(name, model_cfg.num_layers):
            continue
        raise UserError(
            f"'{hf_dir}' holds '{name}', which the model's config.json does not describe; it would be dropped"
        )
    emb = src.shape("model.embed_tokens.weight")
    if emb != (vocab, model_cfg.hidden_size):
        raise UserError(
            f"model.embed_tokens.weight is {emb} but config.json says vocab {vocab} x hidden {model_cfg.hidden_size}"
        )
    torch_dtype = DTYPES[dtype]
    shapes = {p.mcore: _shape_of(p, src) for p in params}
    drafter_shapes = get_style(cfg.mtp.style).convert().drafter_shapes(cfg, vocab)
    for key, shape in shapes.items():
        check_shape(key, shape, model_cfg, vocab, f"'{hf_dir}'", drafter_shapes)
    total = sum(math.prod(s) for s in shapes.values()) * torch_dtype.itemsize
    out_dir = Path(out_dir)
    tokenizer_bytes = sum(tree_bytes(main.path / n) for n in TOKENIZER_FILES)
    with staged_dir(out_dir, needed_bytes=total + tokenizer_bytes) as tmp:
        writer = TorchDistWriter(tmp)
        try:
            with Progress(total, f"from-hf {hf_dir.name}") as bar:
                for p in params:
                    shape = shapes[p.mcore]
                    if p.per_expert:
                        writer.declare(p.mcore, shape, p.transform.dtype(torch_dtype))
                        for e in range(p.num_experts):
                            chunk = _assemble(p, src, torch_dtype, e)
                            writer.write_chunk(p.mcore, (e,) + (0,) * (len(shape) - 1), chunk)
                            bar.advance(chunk.numel() * chunk.element_size(), 0)
                    else:
                        tensor = _assemble(p, src, torch_dtype, None)
                        writer.write_tensor(p.mcore, tensor)
                        bar.advance(tensor.numel() * tensor.element_size(), 0)
                    bar.advance(0, 1)
                    for key in extra_state_keys(p):
                        writer.write_object(key, [None])
            writer.finish({})
        finally:
            writer.abort()
        final = out_dir.absolute()
        tok_dst = tmp / TOKENIZER_DIR
        has_tokenizer = (main.path / "tokenizer.json").is_file()
        if has_tokenizer:
            tok_dst.mkdir()
            for name in TOKENIZER_FILES:
                if (main.path / name).is_file():
                    (tok_dst / name).write_bytes((main.path / name).read_bytes())
        if has_tokenizer:
            cfg.data.tokenizer = str(final / TOKENIZER_DIR)
        record_source(main.path, tmp)
        write_checkpoint_info(tmp, cfg, train_state_record(has_optimizer=False))
    return out_dir
