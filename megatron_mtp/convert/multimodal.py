"""``to-hf --multimodal-from SRC``: the text model an import took out of a multimodal checkpoint (Gemma 4's
``Gemma4ForConditionalGeneration``) put back among the towers it left there.

Design note. ``from-hf`` imports the text model of a multimodal download and leaves its vision and audio
towers out (the family's ``import_names``). An export names the same download as SRC: the main directory
is then the multimodal model again, its text tensors under the family's multimodal names
(``export_names``: ``model.language_model.*``), every tensor SRC holds outside the text model copied
unchanged (bytes and dtype), config.json SRC's with the text model's config in its place
(``multimodal_config``), and SRC's processor files beside it. The text model must be SRC's shape (the
same layers, width and vocabulary): anything else is one sentence before anything is written. MTP
modules stay text-only: ``--mtp separate`` writes them to OUT/mtp as for a text export.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from megatron_mtp.errors import UserError
from megatron_mtp.hf_dir.safetensors_io import HFDir, PlannedTensor

PROCESSOR_FILES = ("preprocessor_config.json", "processor_config.json", "video_preprocessor_config.json",
                   "chat_template.jinja", "chat_template.json")
"""Files of SRC that go with its towers (what AutoProcessor reads)."""


@dataclass
class Towers:
    """The multimodal source of an export: its directory, its tensors outside the text model, the renames."""

    source: HFDir
    names: list[str]
    """SRC's tensors the import leaves out, in SRC's order: written after the text model's."""
    rename: Callable[[str], str]
    """A text-model name -> its name in the multimodal file."""
    wrap_config: Callable[[dict, dict], dict]
    """(SRC's config.json, the text model's) -> the multimodal config.json."""

    def planned(self) -> list[PlannedTensor]:
        return [PlannedTensor(n, self.source.shape(n), self.source.dtype(n)) for n in self.names]

    def copy_files(self, out: Path) -> None:
        for name in PROCESSOR_FILES:
            if (self.source.path / name).is_file():
                shutil.copy2(self.source.path / name, out / name)


def open_towers(family, path, text_config: dict, mtp_mode: str) -> Towers:
    """The towers of ``path`` for an export of ``family``'s model whose text config.json is ``text_config``."""
    if family.import_names is None or family.export_names is None:
        raise UserError(f"--multimodal-from puts a text model back into its multimodal checkpoint, and {family.title} "
                        "has none; drop --multimodal-from")
    if mtp_mode == "inline":
        raise UserError("--multimodal-from writes the multimodal model to OUT (or OUT/main), and --mtp inline would "
                        "put the text-only MTP layers into it; export with --mtp separate or --mtp none")
    path = Path(path)
    if not (path / "config.json").is_file():
        raise UserError(f"--multimodal-from '{path}' has no config.json; pass the multimodal Hugging Face directory "
                        "the model was imported from")
    source = HFDir(path)
    rename = family.import_names(source.config)
    if rename is None:
        raise UserError(f"--multimodal-from '{path}' holds a text model (model_type "
                        f"{source.config.get('model_type')!r}), not a multimodal one; export without it")
    theirs = family.hf_view(source.config, str(path / "config.json"))
    ours = family.hf_view(text_config, "the export's config.json")
    for key in ("num_hidden_layers", "hidden_size", "vocab_size"):
        if getattr(theirs, key) != getattr(ours, key):
            raise UserError(f"--multimodal-from '{path}' has a text model with {key} {getattr(theirs, key)} and this "
                            f"checkpoint's has {getattr(ours, key)}; pass the checkpoint the model was imported from")
    names = [n for n in source.names() if rename(n) is None]
    return Towers(source, names, family.export_names, family.multimodal_config)
