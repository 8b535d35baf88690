"""What ``convert to-hf`` will write, settled before anything is read or written.

``resolve_export_options`` checks each option alone (one sentence each), opens the checkpoint, lets
``--for`` pick the layout and dtype its engine loads (convert/serving.py), refuses the combinations
the checkpoint or family cannot take, and collects every engine's problems with the export for
SERVING.md (with ``--for`` the first of that engine's is the error). to_hf.py then only streams.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Optional

import torch

from megatron_mtp.checkpoint.info import read_config
from megatron_mtp.checkpoint.run_dir import resolve_checkpoint
from megatron_mtp.checkpoint.torch_dist_reader import TorchDistReader
from megatron_mtp.config import Config
from megatron_mtp.config.mtp_style import MTPStyle, get_style
from megatron_mtp.convert import serving
from megatron_mtp.errors import UserError
from megatron_mtp.models.family import Family, get_family
from megatron_mtp.models.tensor_table import mtp_key_prefixes, release_mtp_name
from megatron_mtp.output import check_output_free

MtpMode = Literal["separate", "inline", "none", "only"]
MtpLayout = Literal["hf", "nextn"]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp8": torch.bfloat16}
"""Stored dtype per --dtype; with fp8 the decoder-layer linears become FP8 blocks (convert/fp8_export.py)."""


@dataclass
class ExportOptions:
    """The export as settled: the checkpoint opened and every option resolved."""

    step: Path
    """The checkpoint step directory read."""
    cfg: Config
    """The checkpoint's config."""
    reader: TorchDistReader
    """The open checkpoint."""
    mtp: MtpMode
    """The layout written (``only`` becomes ``separate``; see ``only``)."""
    mtp_layout: MtpLayout
    """The MTP naming: the release's (hf) or SGLang's NextN directory."""
    dtype: str
    """bf16, fp32 or fp8."""
    only: bool
    """Only the MTP directory of the separate layout is written, as OUT itself."""
    has_mtp: bool
    """The checkpoint holds MTP weights (of its style)."""
    style: MTPStyle
    """The checkpoint's MTP style (its export format: mtp_styles/)."""
    family: Family
    """The checkpoint's model family."""
    export: serving.Export
    """What serving needs to know about the export."""
    found: list[serving.Problem]
    """Every engine's problems with the export (for SERVING.md)."""
    out_dir: Path
    """Where the export goes."""


def serving_export(cfg: Config, out: Path, mode: MtpMode, mtp_layout: MtpLayout, dtype: str,
                   speculative: Optional[int] = None) -> serving.Export:
    """What serving needs to know about this export (convert/serving.py)."""
    m, family = cfg.model, get_family(cfg.model.family)
    return serving.Export(
        out=out, layout=serving.layout_name(mode, mtp_layout), dtype=dtype, num_layers=m.num_layers,
        depth=cfg.mtp.modules if mode != "none" else 0, repeats=cfg.mtp.num_layers if cfg.mtp.repeated_layer else 1,
        hidden_size=m.hidden_size, moe=m.num_experts > 0,
        tied=m.tie_embeddings, speculative=speculative, **get_style(cfg.mtp.style).convert().serving_flags(),
        family=cfg.model.family, architecture=family.architecture,
        mla_head_size=family.serving.mla_head_size(cfg) if family.serving.mla_head_size else None,
        index_head_dim=family.serving.index_head_dim(cfg) if family.serving.index_head_dim else None,
    )


def check_serving(
    export: serving.Export, serve_for: Optional[str], note: Optional[Callable[[str], None]] = None
) -> list[serving.Problem]:
    """Every engine's problems with this export (for SERVING.md). With ``serve_for`` its first one is
    the error; without, no engine was named, so ``note`` gets one line pointing at SERVING.md."""
    found = [p for engine in serving.ENGINES for p in serving.problems(engine, export)]
    if serve_for is not None:
        mine = [p for p in found if p.engine == serve_for]
        if mine:
            raise UserError(mine[0].sentence)
    elif note is not None and found:
        engines = sorted({p.engine for p in found})
        note(f"SERVING.md says what {' and '.join(engines)} cannot do with this export ({len(found)} "
             f"point{'s' if len(found) > 1 else ''}); name the engine with --for to have it checked")
    return found


def resolve_export_options(
    ckpt_path: str | Path, out_dir: str | Path, mtp: Optional[MtpMode], mtp_layout: Optional[MtpLayout],
    dtype: Optional[str], serve_for: Optional[str], speculative: Optional[int],
    warn: Optional[Callable[[str], None]],
) -> ExportOptions:
    """The options of ``export_to_hf`` checked and resolved against the checkpoint (UserError for any
    that cannot be written); nothing is written."""
    if mtp not in (None, "separate", "inline", "none", "only"):
        raise UserError(f"--mtp must be separate, inline, none or only, not '{mtp}'")
    if mtp == "only" and serve_for is not None:
        raise UserError("--mtp only writes the MTP directory without a model to serve; drop --for, or export "
                        "the whole model with --for")
    if mtp_layout not in (None, "hf", "nextn"):
        raise UserError(f"--mtp-layout must be hf or nextn, not '{mtp_layout}'")
    if dtype is not None and dtype not in DTYPES:
        raise UserError(f"--dtype must be bf16, fp32 or fp8, not '{dtype}'")
    serving.check_engine(serve_for)
    if speculative is not None and speculative < 1:
        raise UserError(f"--speculative must be a positive number of draft tokens, not {speculative}")
    check_output_free(Path(out_dir).absolute())
    resolved = resolve_checkpoint(ckpt_path)
    step = resolved.path
    if resolved.note:
        print(f"note: {resolved.note}", file=sys.stderr)
    cfg = read_config(step)
    reader = TorchDistReader(step)
    mtp_keys = mtp_key_prefixes()
    has_mtp = cfg.mtp.num_layers > 0 and any(k.startswith(mtp_keys) for k in reader.keys())
    style = get_style(cfg.mtp.style)
    mtp = style.convert().check_export(mtp, mtp_layout, serve_for, has_mtp)  # the layouts its format has
    only = mtp == "only"  # the MTP directory of the separate layout, written as OUT itself
    mtp, mtp_layout, dtype = serving.choose_layout(serve_for, "separate" if only else mtp, mtp_layout, dtype,
                                                   has_mtp, cfg.model.num_layers, cfg.model.family)
    family = get_family(cfg.model.family)
    if dtype == "fp8" and family.serving.no_fp8_export is not None:
        raise UserError(f"--dtype fp8 is not written for {family.title}: {family.serving.no_fp8_export}; export "
                        "with --dtype bf16 or fp32")
    if mtp_layout == "nextn" and mtp != "separate":
        raise UserError("--mtp-layout nextn only applies to --mtp separate or only")
    if mtp != "none" and not has_mtp:
        raise UserError(f"checkpoint '{step}' has no MTP layers; export it with --mtp none" +
                        ("" if not only else " (--mtp only writes MTP layers alone)"))
    if mtp_layout == "nextn" and family.table.mtp_names is not release_mtp_name:
        raise UserError(f"--mtp-layout nextn renames the release's MTP layers for SGLang's DeepSeek-V3 draft, and "
                        f"{family.title} names its MTP module its own way (SGLang reads it as written); export with "
                        "--mtp-layout hf")
    if mtp_layout == "nextn" and cfg.mtp.modules > 1:
        raise UserError(
            f"--mtp-layout nextn writes SGLang's NextN directory, which holds one MTP module, and checkpoint "
            f"'{step}' has {cfg.mtp.modules}; export with --mtp-layout hf"
        )
    if speculative is not None and mtp == "none":
        raise UserError("--speculative sets the draft tokens of the MTP serving commands, and an export with "
                        "--mtp none has no MTP module")
    out_dir = Path(out_dir)
    export = serving_export(cfg, out_dir.absolute(), mtp, mtp_layout, dtype, speculative)
    say = (lambda text: print(f"note: {text}", file=sys.stderr)) if warn is not None else None
    found = [] if only else check_serving(export, serve_for, say)
    return ExportOptions(step, cfg, reader, mtp, mtp_layout, dtype, only, has_mtp, style, family, export, found,
                         out_dir)
