"""megatron-core torch_dist checkpoint -> Hugging Face directory of its family (DeepSeek-V3 or
GLM-4.5; main, MTP, or both). The checkpoint's ``model.family`` gives the tensor table and config.json.

Layouts (``mtp``):
  separate  OUT/main = standard HF model (num_nextn_predict_layers 0, tokenizer);
            OUT/mtp  = only MTP tensors + own index + config stating num_nextn_predict_layers.
            With ``mtp_layout="hf"`` MTP keeps the release naming (layer num_hidden_layers + d, with
            embed_tokens / shared_head.head copies) so main + mtp = the official release layout;
            ``"nextn"`` is SGLang's NextN directory (layer d, copies dropped).
  inline    OUT = one directory in the official release layout (main and MTP layers together).
  none      OUT = main only.
  only      OUT = the MTP directory of ``separate`` alone (its tensors, index and config.json): a new
            draft (e.g. from mtp.freeze_base training) to ship next to an unchanged base release;
            ``from-hf BASE OUT2 --mtp-dir OUT`` pairs them again.
An MTP style with a format of its own (parallel heads, a separate drafter: its ``convert`` module,
mtp_styles/<name>/convert.py) says which of these it has and what its mtp/ config.json is.

Serving: ``serve_for`` (``--for``) picks the layout an engine loads with the fewest flags and
refuses, before anything is written, what it cannot load or run (convert/serving.py); without it
the same facts are warnings. The options are settled before streaming starts (convert/export_options.py).
Every export ends with OUT/SERVING.md, the commands that serve it (convert/serving_text.py).
config.json and generation_config.json carry back what an imported HF model said and still holds
(convert/hf_source.py).

Streaming: the plan (every output name, shape, dtype, shard) is computed from checkpoint metadata
alone (``plan_export`` computes the same from a config, for checks that write nothing); then each
global tensor (routed experts: one expert at a time) is read, split into its HF tensors, cast and
appended to its shard. The result is byte-identical for any training layout
because it depends only on global tensors.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import torch

from megatron_mtp.checkpoint.finite import bytes_are_finite, recorded_finite, refuse_nonfinite, tensor_is_finite
from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import get_style
from megatron_mtp.convert import fp8_export, serving, serving_text
from megatron_mtp.convert.drafter_dir import dir_name, in_drafter_dir
from megatron_mtp.convert.export_options import DTYPES, MtpLayout, MtpMode, resolve_export_options
from megatron_mtp.convert.hf_source import GENERATION_CONFIG, generation_config, source_config, source_generation_config
from megatron_mtp.convert.progress import Progress
from megatron_mtp.convert.shapes import check_shape, expected_shape
from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import PlannedTensor, ShardedSafetensorsWriter
from megatron_mtp.hf_dir.tokenizer_files import copy_tokenizer, special_token_ids
from megatron_mtp.models.family import get_family
from megatron_mtp.models.hf_common import TOKEN_ID_KEYS
from megatron_mtp.models.tensor_table import EMBEDDING, Param, model_key_prefixes, nextn_name
from megatron_mtp.output import staged_dir, tree_bytes


@dataclass(frozen=True)
class Piece:
    """One read from the checkpoint and the HF tensors cut out of it."""

    param: Param
    rows: Optional[tuple[int, int]]  # expert slice of the leading axis, or None for the whole tensor
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # (destination, hf name, shape)


def select_params(reader: TorchDistReader, cfg: Config, step: Path) -> list[Param]:
    """The table rows present in the checkpoint; every model tensor must be claimed by one."""
    table = [p for p in _table(cfg, reader.entry(EMBEDDING).shape[0]) if p.mcore in reader]
    claimed, model_keys = {p.mcore for p in table}, model_key_prefixes()
    for key in reader.keys():
        if key.startswith(model_keys) and key not in claimed:
            raise UserError(
                f"checkpoint '{step}' holds '{key}', which its config.yaml does not describe "
                "(config/weights mismatch); the export would drop it"
            )
    produced = {name for p in table for name in p.hf_names()}
    for param in _table(cfg, reader.entry(EMBEDDING).shape[0], spec="local"):
        for name in param.hf_names():
            if name not in produced:
                raise UserError(
                    f"checkpoint '{step}' has no tensor for '{name}' (megatron key '{param.mcore}' or its "
                    "TE spelling); its config.yaml describes a different model"
                )
    return table


def _table(cfg: Config, vocab: int, spec=None) -> list[Param]:
    """Every tensor of the checkpoint's model: the family's table with the MTP style's rows, and a separate
    drafter's rows (the style's ``drafter_params``), in checkpoint order."""
    family, style = get_family(cfg.model.family), get_style(cfg.mtp.style)
    return (family.param_table(cfg.model, cfg.mtp.modules, spec=spec, style=style.name)
            + style.convert().drafter_params(cfg, vocab))


def _check_shapes(reader: TorchDistReader, params: list[Param], cfg: Config, step: Path) -> None:
    vocab = reader.entry(EMBEDDING).shape[0]
    drafter = get_style(cfg.mtp.style).convert().drafter_shapes(cfg, vocab)
    for p in params:
        check_shape(p.mcore, reader.entry(p.mcore).shape, cfg.model, vocab, f"checkpoint '{step}'", drafter)


def _destination(param: Param, mode: MtpMode) -> Optional[str]:
    if param.part == "main":
        return "main"
    if mode == "none":
        return None
    return "mtp" if mode == "separate" else "main"


def plan_pieces(
    params: list[Param], shape_of: Callable[[str], tuple[int, ...]], num_layers: int, mode: MtpMode,
    mtp_layout: MtpLayout,
) -> list[Piece]:
    pieces = []
    for p in params:
        dest = _destination(p, mode)
        if dest is None:
            continue
        shape = shape_of(p.mcore)

        def rename(name: str, dest: str = dest) -> Optional[str]:
            if in_drafter_dir(name):  # a separate drafter's own directory
                return dir_name(name)
            if dest == "mtp" and mtp_layout == "nextn":
                return nextn_name(name, num_layers)
            return name

        if p.per_expert:
            inner = shape[1:]
            for e in range(p.num_experts):
                names = [rename(n.format(e=e)) for n in p.hf]
                pieces.append(Piece(p, (e, e + 1), _split_outputs(dest, names, inner, p)))
        else:
            names = [rename(n) for n in p.hf]
            if all(n is None for n in names):
                continue
            pieces.append(Piece(p, None, _split_outputs(dest, names, shape, p)))
    return pieces


def _plans(pieces: list[Piece], dtype: torch.dtype, fp8: bool = False) -> dict[str, list[PlannedTensor]]:
    plans: dict[str, list[PlannedTensor]] = {}
    for piece in pieces:
        for dest, name, shape in piece.outputs:
            if fp8 and fp8_export.is_fp8_weight(name):
                plans.setdefault(dest, []).extend(PlannedTensor(*t) for t in fp8_export.planned(name, shape))
            else:
                plans.setdefault(dest, []).append(PlannedTensor(name, shape, _out_dtype(piece.param, dtype)))
    return plans


def plan_export(cfg: Config, vocab: int, mode: MtpMode, mtp_layout: MtpLayout = "hf",
                dtype: str = "bf16") -> dict[str, list[PlannedTensor]]:
    """The tensors ("main"/"mtp" part -> planned tensors) an export of a checkpoint with this config
    writes, from the config alone (the export of a real checkpoint plans the same from its metadata)."""
    params = _table(cfg, vocab, spec="te")
    drafter = get_style(cfg.mtp.style).convert().drafter_shapes(cfg, vocab)
    pieces = plan_pieces(params, lambda key: expected_shape(key, cfg.model, vocab, drafter), cfg.model.num_layers,
                         mode, mtp_layout)
    return _plans(pieces, DTYPES[dtype], dtype == "fp8")


def _split_outputs(dest: str, names: list[Optional[str]], shape: tuple[int, ...], param: Param):
    rows = param.transform.part_rows(shape[0])  # one name: all its rows, or the first (a drafter's vocabulary)
    return tuple((dest, n, (r, *shape[1:])) for n, r in zip(names, rows) if n is not None)


def _out_dtype(param: Param, dtype: torch.dtype) -> torch.dtype:
    return param.transform.dtype(dtype)


def _has_fp8(piece: Piece) -> bool:
    """Whether an output of ``piece`` is stored in FP8 (an --dtype fp8 export quantises it)."""
    return any(fp8_export.is_fp8_weight(name) for _, name, _ in piece.outputs)


def _tensors_of(piece: Piece, tensor: torch.Tensor, dtype: torch.dtype,
                fp8: bool = False) -> Iterator[tuple[str, str, torch.Tensor]]:
    """(destination, name, tensor) of each output; with ``fp8`` the FP8 weights and their scales."""
    if piece.rows is not None:
        tensor = tensor[0]
    if fp8 and _has_fp8(piece):
        parts = piece.param.transform.to_hf(tensor)
        for (dest, name, _), part in zip(piece.outputs, parts):
            for out_name, out in fp8_export.quantized(name, part):
                yield dest, out_name, out
        return
    tensor = tensor.to(_out_dtype(piece.param, dtype))
    for (dest, name, _), part in zip(piece.outputs, piece.param.transform.to_hf(tensor)):
        yield dest, name, part.contiguous()


def _direct_ranges(reader: TorchDistReader, piece: Piece, dtype: torch.dtype, fp8: bool = False):
    """(file, [(offset, nbytes) per output]) when the outputs are unchanged stored bytes."""
    entry = reader.entry(piece.param.mcore)
    if entry.dtype != _out_dtype(piece.param, dtype) or len(piece.outputs) != len(piece.param.hf):
        return None
    if piece.param.transform.interleaved:  # q, k and v rows interleave per group: not contiguous ranges
        return None
    if fp8 and _has_fp8(piece):
        return None
    if piece.rows is None and sum(shape[0] for _, _, shape in piece.outputs) != entry.shape[0]:
        return None  # the outputs keep some of its rows
    found = reader.byte_range(piece.param.mcore, piece.rows)
    if found is None:
        return None
    fh, offset, nbytes = found
    parts = len(piece.outputs)
    step = nbytes // parts
    return fh, [(offset + i * step, step) for i in range(parts)]


def hf_configs(
    cfg: Config, vocab: int, mode: MtpMode, mtp_layout: MtpLayout, dtype: str,
    tokenizer_ids: dict[str, Optional[int]], source: Optional[dict[str, Any]] = None,
    target: Optional[Path] = None, speculative: Optional[int] = None,
) -> dict[str, dict]:
    """config.json of each part. main/ of the separate layouts says ``num_nextn_predict_layers: 0``:
    it holds no MTP layer, and an engine told otherwise would look for its draft there (SGLang
    silently loads nothing); SGLang's NextN directory is its one-module form (``num_hidden_layers: 1``).
    ``target``: where the target's export is written (None: not written, ``--mtp only``); ``speculative``:
    ``--speculative``, both for the MTP style's mtp/ config.json (a drafter may name them)."""
    style = get_style(cfg.mtp.style)  # a separate drafter: the target's config says no MTP layer
    depth = cfg.mtp.modules if mode != "none" and not style.separate_drafter else 0
    family = get_family(cfg.model.family)
    full = family.to_hf_config(cfg.model, cfg.mtp, vocab_size=vocab, num_nextn_predict_layers=depth,
                        torch_dtype="float32" if dtype == "fp32" else "bfloat16",
                        bos_token_id=tokenizer_ids.get("bos_token_id"),
                        eos_token_id=tokenizer_ids.get("eos_token_id")).to_dict()
    full = family.carry_source_fields(full, source, tokenizer_ids)
    if dtype == "fp8":
        full = fp8_export.with_quantization(full)
    if mode in ("none", "inline"):
        return {"main": full}
    mtp = style.convert().mtp_config(cfg, vocab, full, depth, dtype, mtp_layout, family, target, speculative)
    return {"main": full if style.separate_drafter else dict(full, num_nextn_predict_layers=0), "mtp": mtp}


def export_to_hf(
    ckpt_path: str | Path,
    out_dir: str | Path,
    mtp: Optional[MtpMode] = None,
    mtp_layout: Optional[MtpLayout] = None,
    dtype: Optional[str] = None,
    max_shard_bytes: int = 4 << 30,
    serve_for: Optional[str] = None,
    speculative: Optional[int] = None,
    warn: Optional[Callable[[str], None]] = None,
    multimodal_from: Optional[str | Path] = None,
) -> Path:
    """Convert a megatron-mtp checkpoint (run dir or step dir) to HF format under ``out_dir``.

    ``mtp``/``mtp_layout``/``dtype`` left None: what ``serve_for`` picks, else separate/hf/bf16.
    ``speculative``: draft tokens per step in the MTP commands of SERVING.md. ``warn`` receives,
    before anything is written, each thing a serving engine cannot do with the export (without
    ``serve_for``; the CLI prints them; SERVING.md lists them either way)."""
    o = resolve_export_options(ckpt_path, out_dir, mtp, mtp_layout, dtype, serve_for, speculative, warn)
    cfg, step, reader, mtp, mtp_layout, dtype, only = o.cfg, o.step, o.reader, o.mtp, o.mtp_layout, o.dtype, o.only
    family, export, found, out_dir = o.family, o.export, o.found, o.out_dir
    params = select_params(reader, cfg, step)
    _check_shapes(reader, params, cfg, step)
    reader.validate(sorted({p.mcore for p in params}))
    pieces = plan_pieces(params, lambda key: reader.entry(key).shape, cfg.model.num_layers, mtp, mtp_layout)
    if only:
        pieces = [piece for piece in pieces if all(dest == "mtp" for dest, _, _ in piece.outputs)]
    torch_dtype = DTYPES[dtype]
    fp8 = dtype == "fp8"
    plans = _plans(pieces, torch_dtype, fp8)
    note = fp8_export.cpu_dequant_note([t for plan in plans.values() for t in plan]) if fp8 else None
    if note is not None and warn is not None:
        warn(note)
    vocab = reader.entry(EMBEDDING).shape[0]
    tokenizer_ids = special_token_ids(step / TOKENIZER_DIR)
    configs = hf_configs(cfg, vocab, mtp, mtp_layout, dtype, tokenizer_ids, source_config(step),
                         None if only else export.main_dir, speculative)
    towers, rename = None, {}
    if multimodal_from is not None and not only:  # the text model back among its towers (convert/multimodal.py)
        from megatron_mtp.convert.multimodal import open_towers

        towers = open_towers(family, multimodal_from, configs["main"], mtp)
        rename = {t.name: towers.rename(t.name) for t in plans["main"]}
        plans["main"] = [dataclasses.replace(t, name=rename[t.name]) for t in plans["main"]] + towers.planned()
        configs["main"] = towers.wrap_config(towers.source.config, configs["main"])
    gen = generation_config(tokenizer_ids, {k: configs["main"].get(k) for k in TOKEN_ID_KEYS},
                            source_generation_config(step))
    if only:
        configs = {"mtp": configs["mtp"]}
    size = sum(p.nbytes for plan in plans.values() for p in plan) + (0 if only else tree_bytes(step / TOKENIZER_DIR))
    scan = not recorded_finite(step)  # copied bytes need a read of their own unless the trainer checked them
    with staged_dir(out_dir, needed_bytes=size) as tmp, reader:
        dirs = ({"mtp": tmp} if only else {"main": tmp / "main", "mtp": tmp / "mtp"} if mtp == "separate"
                else {"main": tmp})
        writers = {d: ShardedSafetensorsWriter(dirs[d], plans[d], max_shard_bytes) for d in plans}
        total = sum(w.total_bytes for w in writers.values())
        try:
            with Progress(total, f"to-hf {step.name}") as bar:
                for piece in pieces:
                    direct = _direct_ranges(reader, piece, torch_dtype, fp8)
                    if direct is not None:  # same bytes: file-to-file copy, no decode
                        fh, ranges = direct
                        for (dest, name, _), (offset, nbytes) in zip(piece.outputs, ranges):
                            if scan and not bytes_are_finite(fh, offset, nbytes, reader.entry(piece.param.mcore).dtype):
                                refuse_nonfinite(piece.param.mcore, f"checkpoint '{step}'")
                            writers[dest].copy_from(rename.get(name, name) if dest == "main" else name, fh, offset,
                                                    nbytes)
                            bar.advance(nbytes)
                        continue
                    tensor = reader.read(piece.param.mcore, piece.rows)
                    if not tensor_is_finite(tensor):
                        refuse_nonfinite(piece.param.mcore, f"checkpoint '{step}'")
                    for dest, name, part in _tensors_of(piece, tensor, torch_dtype, fp8):
                        writers[dest].write(rename.get(name, name) if dest == "main" else name, part)
                        bar.advance(part.numel() * part.element_size())
                for name in towers.names if towers is not None else ():  # unchanged, after the text model
                    tensor = towers.source.raw(name)
                    writers["main"].write(name, tensor)
                    bar.advance(tensor.numel() * tensor.element_size())
            for writer in writers.values():
                writer.finish()
        finally:
            for writer in writers.values():
                writer.abort()
        for dest, config in configs.items():
            (dirs[dest] / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        for name, data in (o.style.convert().extra_files(cfg, vocab, speculative) if o.has_mtp and "mtp" in dirs
                           else {}).items():  # e.g. how many tokens a separate drafter drafts
            (dirs["mtp"] / name).write_text(json.dumps(data, indent=2) + "\n")
        if only:  # the base release keeps its tokenizer and serving files
            return out_dir
        if not copy_tokenizer(step / TOKENIZER_DIR, dirs["main"]):
            print(f"warning: checkpoint '{step}' has no tokenizer/ directory; the export has no tokenizer files")
        if gen is not None:
            (dirs["main"] / GENERATION_CONFIG).write_text(json.dumps(gen, indent=2) + "\n")
        if towers is not None:
            towers.copy_files(dirs["main"])
        (tmp / serving.SERVING_FILE).write_text(serving_text.serving_text(export, found))
    return out_dir
