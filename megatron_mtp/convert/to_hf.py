"""megatron-core torch_dist checkpoint -> Hugging Face DeepSeek-V3 directory (main, MTP, or both).

Layouts (``mtp``):
  separate  OUT/main = standard HF model (num_nextn_predict_layers 0, tokenizer);
            OUT/mtp  = only MTP tensors + own index + config stating num_nextn_predict_layers.
            With ``mtp_layout="hf"`` MTP keeps the release naming (layer num_hidden_layers + d, with
            embed_tokens / shared_head.head copies) so main + mtp = the official release layout;
            ``"nextn"`` is SGLang's NextN directory (layer d, copies dropped).
  inline    OUT = one directory in the official release layout (main and MTP layers together).
  none      OUT = main only.

Streaming: the plan (every output name, shape, dtype, shard) is computed from checkpoint metadata
alone; then each global tensor (routed experts: one expert at a time) is read, split into its HF
tensors, cast and appended to its shard. The result is byte-identical for any training layout
because it depends only on global tensors.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Literal, Optional

import torch

from megatron_mtp.checkpoint.info import read_config
from megatron_mtp.checkpoint.run_dir import TOKENIZER_DIR, resolve_checkpoint
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.config import Config
from megatron_mtp.convert.progress import Progress
from megatron_mtp.convert.safetensors_io import PlannedTensor, ShardedSafetensorsWriter
from megatron_mtp.convert.shapes import check_shape
from megatron_mtp.convert.staging import staged_dir
from megatron_mtp.convert.tokenizer_files import copy_tokenizer, special_token_ids
from megatron_mtp.errors import UserError
from megatron_mtp.models.deepseek_v3.hf_config import to_hf_config
from megatron_mtp.models.deepseek_v3.hf_mapping import EMBEDDING, MODEL_KEY_PREFIXES, Param, nextn_name, param_table

MtpMode = Literal["separate", "inline", "none"]
MtpLayout = Literal["hf", "nextn"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


@dataclass(frozen=True)
class Piece:
    """One read from the checkpoint and the HF tensors cut out of it."""

    param: Param
    rows: Optional[tuple[int, int]]  # expert slice of the leading axis, or None for the whole tensor
    outputs: tuple[tuple[str, str, tuple[int, ...]], ...]  # (destination, hf name, shape)


def select_params(reader: TorchDistReader, cfg: Config, step: Path) -> list[Param]:
    """The table rows present in the checkpoint; every model tensor must be claimed by one."""
    table = [p for p in param_table(cfg.model, cfg.mtp.num_layers) if p.mcore in reader]
    claimed = {p.mcore for p in table}
    for key in reader.keys():
        if key.startswith(MODEL_KEY_PREFIXES) and key not in claimed:
            raise UserError(
                f"checkpoint '{step}' holds '{key}', which its config.yaml does not describe "
                "(config/weights mismatch); the export would drop it"
            )
    produced = {name for p in table for name in p.hf_names()}
    for param in param_table(cfg.model, cfg.mtp.num_layers, spec="local"):
        for name in param.hf_names():
            if name not in produced:
                raise UserError(
                    f"checkpoint '{step}' has no tensor for '{name}' (megatron key '{param.mcore}' or its "
                    "TE spelling); its config.yaml describes a different model"
                )
    return table


def _check_shapes(reader: TorchDistReader, params: list[Param], cfg: Config, step: Path) -> None:
    vocab = reader.entry(EMBEDDING).shape[0]
    for p in params:
        check_shape(p.mcore, reader.entry(p.mcore).shape, cfg.model, vocab, f"checkpoint '{step}'")


def _destination(param: Param, mode: MtpMode) -> Optional[str]:
    if param.part == "main":
        return "main"
    if mode == "none":
        return None
    return "mtp" if mode == "separate" else "main"


def plan_pieces(
    reader: TorchDistReader, params: list[Param], num_layers: int, mode: MtpMode, mtp_layout: MtpLayout
) -> list[Piece]:
    pieces = []
    for p in params:
        dest = _destination(p, mode)
        if dest is None:
            continue
        shape = reader.entry(p.mcore).shape

        def rename(name: str, dest: str = dest) -> Optional[str]:
            if dest == "mtp" and mtp_layout == "nextn":
                return nextn_name(name, num_layers)
            return name

        if p.num_experts:
            inner = shape[1:]
            for e in range(p.num_experts):
                names = [rename(n.format(e=e)) for n in p.hf]
                pieces.append(Piece(p, (e, e + 1), _split_outputs(dest, names, inner)))
        else:
            names = [rename(n) for n in p.hf]
            if all(n is None for n in names):
                continue
            pieces.append(Piece(p, None, _split_outputs(dest, names, shape)))
    return pieces


def _split_outputs(dest: str, names: list[Optional[str]], shape: tuple[int, ...]):
    if len(names) == 1:
        return ((dest, names[0], tuple(shape)),) if names[0] is not None else ()
    half = (shape[0] // 2, *shape[1:])
    return tuple((dest, n, half) for n in names if n is not None)


def _out_dtype(param: Param, dtype: torch.dtype) -> torch.dtype:
    return torch.float32 if param.keep_fp32 else dtype


def _tensors_of(piece: Piece, tensor: torch.Tensor, dtype: torch.dtype) -> Iterator[tuple[str, str, torch.Tensor]]:
    if piece.rows is not None:
        tensor = tensor[0]
    tensor = tensor.to(_out_dtype(piece.param, dtype))
    if len(piece.param.hf) == 2:
        parts = tensor.chunk(2, dim=0)
        for (dest, name, _), part in zip(piece.outputs, parts):
            yield dest, name, part
    else:
        for dest, name, _ in piece.outputs:
            yield dest, name, tensor


def _direct_ranges(reader: TorchDistReader, piece: Piece, dtype: torch.dtype):
    """(file, [(offset, nbytes) per output]) when the outputs are unchanged stored bytes."""
    entry = reader.entry(piece.param.mcore)
    if entry.dtype != _out_dtype(piece.param, dtype) or len(piece.outputs) != len(piece.param.hf):
        return None
    found = reader.byte_range(piece.param.mcore, piece.rows)
    if found is None:
        return None
    fh, offset, nbytes = found
    parts = len(piece.outputs)
    step = nbytes // parts
    return fh, [(offset + i * step, step) for i in range(parts)]


def _hf_configs(
    cfg: Config, vocab: int, mode: MtpMode, mtp_layout: MtpLayout, dtype: str, step: Path
) -> dict[str, dict]:
    bos, eos = special_token_ids(step / TOKENIZER_DIR)
    common = dict(vocab_size=vocab, torch_dtype="bfloat16" if dtype == "bf16" else "float32",
                  bos_token_id=bos, eos_token_id=eos)
    depth = cfg.mtp.num_layers
    main = to_hf_config(cfg.model, cfg.mtp, num_nextn_predict_layers=0, **common)
    if mode == "none":
        return {"main": main.to_dict()}
    full = to_hf_config(cfg.model, cfg.mtp, num_nextn_predict_layers=depth, **common)
    if mode == "inline":
        return {"main": full.to_dict()}
    mtp = full
    if mtp_layout == "nextn":
        mtp = dataclasses.replace(full, architectures=("DeepseekV3ForCausalLMNextN",), num_hidden_layers=depth)
    return {"main": main.to_dict(), "mtp": mtp.to_dict()}


def export_to_hf(
    ckpt_path: str | Path,
    out_dir: str | Path,
    mtp: MtpMode = "separate",
    mtp_layout: MtpLayout = "hf",
    dtype: str = "bf16",
    max_shard_bytes: int = 4 << 30,
) -> Path:
    """Convert a megatron-mtp checkpoint (run dir or step dir) to HF format under ``out_dir``."""
    if mtp not in ("separate", "inline", "none"):
        raise UserError(f"--mtp must be separate, inline or none, not '{mtp}'")
    if mtp_layout not in ("hf", "nextn"):
        raise UserError(f"--mtp-layout must be hf or nextn, not '{mtp_layout}'")
    if mtp_layout == "nextn" and mtp != "separate":
        raise UserError("--mtp-layout nextn only applies to --mtp separate")
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be bf16 or fp32, not '{dtype}'")
    resolved = resolve_checkpoint(ckpt_path)
    step = resolved.path
    if resolved.note:
        print(f"note: {resolved.note}", file=sys.stderr)
    cfg = read_config(step)
    reader = TorchDistReader(step)
    has_mtp_keys = any(k.startswith("mtp.") for k in reader.keys())
    if mtp != "none" and (cfg.mtp.num_layers == 0 or not has_mtp_keys):
        raise UserError(f"checkpoint '{step}' has no MTP layers; export it with --mtp none")
    params = select_params(reader, cfg, step)
    _check_shapes(reader, params, cfg, step)
    reader.validate(sorted({p.mcore for p in params}))
    pieces = plan_pieces(reader, params, cfg.model.num_layers, mtp, mtp_layout)
    torch_dtype = DTYPES[dtype]
    plans: dict[str, list[PlannedTensor]] = {}
    for piece in pieces:
        for dest, name, shape in piece.outputs:
            plans.setdefault(dest, []).append(PlannedTensor(name, shape, _out_dtype(piece.param, torch_dtype)))
    vocab = reader.entry(EMBEDDING).shape[0]
    configs = _hf_configs(cfg, vocab, mtp, mtp_layout, dtype, step)
    out_dir = Path(out_dir)
    with staged_dir(out_dir) as tmp, reader:
        dirs = {"main": tmp / "main", "mtp": tmp / "mtp"} if mtp == "separate" else {"main": tmp}
        writers = {d: ShardedSafetensorsWriter(dirs[d], plans[d], max_shard_bytes) for d in plans}
        total = sum(w.total_bytes for w in writers.values())
        try:
            with Progress(total, f"to-hf {step.name}") as bar:
                for piece in pieces:
                    direct = _direct_ranges(reader, piece, torch_dtype)
                    if direct is not None:  # same bytes: file-to-file copy, no decode
                        fh, ranges = direct
                        for (dest, name, _), (offset, nbytes) in zip(piece.outputs, ranges):
                            writers[dest].copy_from(name, fh, offset, nbytes)
                            bar.advance(nbytes)
                        continue
                    tensor = reader.read(piece.param.mcore, piece.rows)
                    for dest, name, part in _tensors_of(piece, tensor, torch_dtype):
                        writers[dest].write(name, part)
                        bar.advance(part.numel() * part.element_size())
            for writer in writers.values():
                writer.finish()
        finally:
            for writer in writers.values():
                writer.abort()
        if not copy_tokenizer(step / TOKENIZER_DIR, dirs["main"]):
            print(f"warning: checkpoint '{step}' has no tokenizer/ directory; the export has no tokenizer files")
        for dest, config in configs.items():
            (dirs[dest] / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return out_dir
